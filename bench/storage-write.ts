import { mkdir, mkdtemp, open, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { FsCheckpointStorage, ParticipantControlPlane, ScriptableKind, WriteGate } from "../participants/index.js";
import { machine, percentile, writeSection } from "./bench-report.js";

/**
 * Targets from the architecture: pause (admission closed → reopened) with 10k parked episodes
 * ≤ 100 ms plus the storage write; records written at ≥ 80% of raw fsynced sequential bandwidth.
 * Raw and record writes alternate in one run on the same disk, so the ratio is fair.
 */
const EPISODES = Number(process.env.STORAGE_BENCH_EPISODES ?? 10_000);
const STATE_BYTES = Number(process.env.STORAGE_BENCH_STATE_BYTES ?? 2048);
const ROUNDS = Number(process.env.STORAGE_BENCH_ROUNDS ?? 5);

function episodeState(i: number): Record<string, unknown> {
  return { turn: i % 17, messages: [{ role: "assistant", content: "x".repeat(STATE_BYTES) }], cursor: i };
}

async function rawWrite(dir: string, bytes: number): Promise<number> {
  const chunk = Buffer.alloc(1 << 20, 0x61);
  const started = performance.now();
  const handle = await open(join(dir, `raw-${Math.random()}`), "w");
  for (let written = 0; written < bytes; written += chunk.byteLength) await handle.write(chunk, 0, Math.min(chunk.byteLength, bytes - written));
  await handle.sync();
  await handle.close();
  return performance.now() - started;
}

export async function run(): Promise<void> {
  const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-bench-storage-"));
  try {
    const records = Array.from({ length: EPISODES }, (_, i) => ({ episode_id: { rollout_id: `r${i}`, attempt: 0 }, state: episodeState(i) }));
    const storage = new FsCheckpointStorage();
    const raw: number[] = [];
    const serialize: number[] = [];
    const recordsMs: number[] = [];
    const pauses: number[] = [];
    const writesInPause: number[] = [];
    let bytes = 0;
    for (let round = 0; round < ROUNDS; round++) {
      const started = performance.now();
      const written = await storage.write(
        { checkpointDir: join(dir, `w${round}`), checkpointId: `w${round}`, kind: "agent", instance: "a0" },
        records,
        { gate: new WriteGate(), createdAt: 0, extra: {} },
      );
      recordsMs.push(performance.now() - started);
      bytes = written.bytes;
      raw.push(await rawWrite(dir, bytes));
      // The CPU floor of any JSON-lines format: serializing the records, no hashing, no I/O.
      const serializeStart = performance.now();
      let chars = 0;
      for (const record of records) chars += JSON.stringify(record).length;
      serialize.push(performance.now() - serializeStart + (chars < 0 ? 1 : 0));

      // A full participant checkpoint of 10k parked episodes, in process: pause = close → reopen.
      const kind = new ScriptableKind("agent");
      records.forEach((r) => kind.addEpisode(r.episode_id, r.state));
      const plane = new ParticipantControlPlane({ adapter: kind, instance: "a0" });
      const id = `p${round}`;
      const deadline = Date.now() / 1000 + 120;
      await mkdir(join(dir, id)); // the coordinator's, made before its commit (during the prepare), off the participant's path
      const pauseStart = performance.now();
      await plane.handle("prepare", { checkpoint_id: id, deadline_ts: deadline, epoch: 1 });
      const writeStart = performance.now();
      await plane.handle("commit", { checkpoint_id: id, deadline_ts: deadline, epoch: 1, checkpoint_dir: join(dir, id), episode_ids: null, stop: false });
      const writeMs = performance.now() - writeStart;
      await plane.handle("resume", { checkpoint_id: id, deadline_ts: deadline, epoch: 1 });
      pauses.push(performance.now() - pauseStart);
      writesInPause.push(writeMs);
      plane.dispose();
      await rm(join(dir, `w${round}`), { recursive: true, force: true });
      await rm(join(dir, id), { recursive: true, force: true });
    }
    const mb = bytes / 2 ** 20;
    const rawMbps = mb / (percentile(raw, 50) / 1000);
    const recMbps = mb / (percentile(recordsMs, 50) / 1000);
    const overhead = pauses.map((p, i) => p - writesInPause[i]!);
    const lines = [
      "## Storage: records write and pause",
      "",
      `Machine: ${machine()}. Command: \`npm run bench -- storage-write\`. ${EPISODES} episodes × ~${STATE_BYTES} B state (${mb.toFixed(1)} MiB of records), ${ROUNDS} rounds, medians.`,
      "",
      "| measure | value | target |",
      "| --- | --- | --- |",
      `| raw fsynced sequential write | ${rawMbps.toFixed(0)} MiB/s | — |`,
      `| records write (serialize + sha256 + fsync + rename + manifest) | ${recMbps.toFixed(0)} MiB/s (${((recMbps / rawMbps) * 100).toFixed(0)}% of raw) | ≥ 80% of raw |`,
      `| JSON serialization alone (no hashing, no I/O) | ${(mb / (percentile(serialize, 50) / 1000)).toFixed(0)} MiB/s (${((percentile(serialize, 50) / percentile(recordsMs, 50)) * 100).toFixed(0)}% of the records write time) | — |`,
      `| pause with ${EPISODES} parked episodes (prepare → commit → resume), p50 | ${percentile(pauses, 50).toFixed(1)} ms | — |`,
      `| of which the storage write, p50 | ${percentile(writesInPause, 50).toFixed(1)} ms | — |`,
      `| pause minus the storage write, p50 / max | ${percentile(overhead, 50).toFixed(1)} / ${Math.max(...overhead).toFixed(1)} ms | ≤ 100 ms |`,
    ];
    // Said only when this run missed it (the figures above are this run's).
    if (recMbps < 0.8 * rawMbps)
      lines.push(
        "",
        "The records write misses the 80% target: it is CPU-bound, not disk-bound. The raw baseline copies ready-made bytes into the page cache and fsyncs them;",
        "the records path must first serialize every record (its share is in the row above), encode and sha256 the bytes, then write and fsync them,",
        "all on one thread of a shared 2-core machine. Moving serialization and hashing off the main thread is the next step if this matters.",
      );
    console.log(lines.join("\n"));
    await writeSection("storage-write", lines.join("\n"));
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

if (import.meta.url === pathToFileURL(process.argv[1] ?? "").href) await run();
