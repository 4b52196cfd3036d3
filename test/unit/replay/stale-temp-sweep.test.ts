import { readdirSync } from "node:fs";
import { mkdir, readdir, utimes, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { RecordWriter, writeRolloutRecords, writeStepRecords } from "../../../participants/replay/index.js";
import { writeJsonLines } from "../../../participants/replay/out-file.js";
import { isTempNameOf, tempNameTarget, writeFileAtomic } from "../../../participants/storage/fs-durable.js";
import { STALE_TEMP_AGE_MS } from "../../../participants/storage/stale-temp-files.js";
import { linearTrace, tempDir, traceId } from "./fixtures.js";

/**
 * A writer's temp files (`.<name>.<pid>.<12 hex>.tmp`) that a crash left between create and rename
 * or link were never removed: every crash of a record write or seeds export left its bytes (up to a
 * whole record file) for good. A writer now sweeps those of its own names older than
 * STALE_TEMP_AGE_MS when it writes into the directory; a younger one may be a live writer's and stays.
 */
let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(async () => {
  vi.useRealTimers();
  await cleanup();
});

/** A file at `file`, last modified `ageMs` ago. */
async function leftover(file: string, ageMs: number): Promise<void> {
  await writeFile(file, "partial");
  const at = (Date.now() - ageMs) / 1000;
  await utimes(file, at, at);
}

const OLD = STALE_TEMP_AGE_MS + 60_000;
const HEX = "0123456789ab";

describe("stale temp files", () => {
  it("a step write removes its step's record, index and marker temps a crash left, and keeps a live writer's and anyone else's", async () => {
    for (const step of [1, 2, 3]) {
      const stepDir = path.join(dir, `step_${step}`);
      await mkdir(stepDir);
      await leftover(path.join(stepDir, `.train_rollouts_gsm8k.jsonl.4242.${HEX}.tmp`), OLD);
      await leftover(path.join(stepDir, `.index_eval_other.jsonl.17.${HEX}.tmp`), OLD);
      await leftover(path.join(stepDir, `._complete_train.json.9.${HEX}.tmp`), OLD);
      await leftover(path.join(stepDir, `.train_rollouts_math.jsonl.4243.${HEX}.tmp`), 1_000); // a live writer's
      await leftover(path.join(stepDir, `.notes.jsonl.1.${HEX}.tmp`), OLD); // not a step file's temp
      await leftover(path.join(stepDir, ".train_rollouts_gsm8k.jsonl.tmp"), OLD); // not writeFileAtomic's name
    }
    const traces = [linearTrace(traceId(1))];
    await writeStepRecords(dir, 1, [{ kind: "train", env: "gsm8k", traces }]);
    await writeRolloutRecords(dir, 2, { kind: "train", env: "gsm8k", traces });
    const writer = new RecordWriter(dir);
    writer.enqueue(3, [{ kind: "eval", env: "gsm8k", traces }]);
    await writer.flush();
    const kept = [`.notes.jsonl.1.${HEX}.tmp`, ".train_rollouts_gsm8k.jsonl.tmp", `.train_rollouts_math.jsonl.4243.${HEX}.tmp`];
    expect((await readdir(path.join(dir, "step_1"))).filter((n) => n.startsWith(".")).sort()).toEqual(kept);
    expect((await readdir(path.join(dir, "step_2"))).filter((n) => n.startsWith(".")).sort()).toEqual(kept);
    expect((await readdir(path.join(dir, "step_3"))).filter((n) => n.startsWith(".")).sort()).toEqual(kept);
  });

  it("a refused step write removes nothing", async () => {
    const stepDir = path.join(dir, "step_1");
    await mkdir(stepDir);
    await leftover(path.join(stepDir, `.train_rollouts_gsm8k.jsonl.4242.${HEX}.tmp`), OLD);
    await expect(writeStepRecords(dir, 1, [{ kind: "train", env: "../x", traces: [] }])).rejects.toMatchObject({ code: "invalid_request" });
    expect(await readdir(stepDir)).toEqual([`.train_rollouts_gsm8k.jsonl.4242.${HEX}.tmp`]);
  });

  it("a seeds --out write removes the old temps of its own name only, a long name's cut ones too", async () => {
    const long = `${"s".repeat(244)}.jsonl`; // 250 bytes: its temp name is cut
    const temps: Record<string, string> = {};
    for (const name of ["seeds.jsonl", long]) {
      // The temp name writeFileAtomic really makes, seen while it is being written.
      function* spy(): Generator<Uint8Array> {
        temps[name] = readdirSync(dir).find((n) => n.startsWith("."))!;
        yield Buffer.from("x");
      }
      await writeFileAtomic(path.join(dir, name), spy());
      expect(isTempNameOf(name, temps[name]!)).toBe(true);
    }
    expect(tempNameTarget(temps["seeds.jsonl"]!)).toBe("seeds.jsonl");
    expect(long.startsWith(tempNameTarget(temps[long]!)!) && tempNameTarget(temps[long]!) !== long).toBe(true); // cut
    expect(isTempNameOf("seeds.json", temps["seeds.jsonl"]!)).toBe(false);
    // Another crashed export's (same pid length: the cut depends on the suffix's).
    const cutOld = temps[long]!.replace(/\.[0-9a-f]{12}\.tmp$/, `.${HEX}.tmp`);
    await leftover(path.join(dir, `.seeds.jsonl.99.${HEX}.tmp`), OLD);
    await leftover(path.join(dir, cutOld), OLD);
    await leftover(path.join(dir, `.seeds.jsonl.98.${HEX}.tmp`), 1_000); // a live export's
    await leftover(path.join(dir, `.other.jsonl.99.${HEX}.tmp`), OLD);
    await writeJsonLines(path.join(dir, "seeds.jsonl"), [{ a: 1 }]);
    expect((await readdir(dir)).filter((n) => n.startsWith(".")).sort()).toEqual([cutOld, `.other.jsonl.99.${HEX}.tmp`, `.seeds.jsonl.98.${HEX}.tmp`].sort());
    await writeJsonLines(path.join(dir, long), [{ a: 1 }]);
    expect((await readdir(dir)).filter((n) => n.startsWith(".")).sort()).toEqual([`.other.jsonl.99.${HEX}.tmp`, `.seeds.jsonl.98.${HEX}.tmp`].sort());
  });

  it("with this host's clock an hour ahead of the directory's (NFS: the server's), a live writer's temp stays and a stale one goes", async () => {
    // Age was judged by this process's Date.now() against mtimes the file server set: a host whose
    // clock ran ahead by more than STALE_TEMP_AGE_MS removed another host's live temp file.
    const stepDir = path.join(dir, "step_1");
    await mkdir(stepDir);
    const live = `.train_rollouts_math.jsonl.4243.${HEX}.tmp`;
    await leftover(path.join(stepDir, live), 1_000);
    await leftover(path.join(stepDir, `.train_rollouts_gsm8k.jsonl.4242.${HEX}.tmp`), OLD);
    await leftover(path.join(dir, `.seeds.jsonl.98.${HEX}.tmp`), 1_000); // a live export's
    await leftover(path.join(dir, `.seeds.jsonl.99.${HEX}.tmp`), OLD);
    vi.useFakeTimers({ toFake: ["Date"] }); // this process's clock only
    vi.setSystemTime(Date.now() + 3_600_000);
    await writeStepRecords(dir, 1, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1))] }]);
    await writeJsonLines(path.join(dir, "seeds.jsonl"), [{ a: 1 }]);
    expect((await readdir(stepDir)).filter((n) => n.startsWith("."))).toEqual([live]);
    expect((await readdir(dir)).filter((n) => n.startsWith("."))).toEqual([`.seeds.jsonl.98.${HEX}.tmp`]);
  });

  it("a clock probe a crash left (between its create and remove) goes with the next sweep once a minute old", async () => {
    const stepDir = path.join(dir, "step_1");
    await mkdir(stepDir);
    await leftover(path.join(stepDir, `.clock-probe.999999999.${HEX}`), 120_000);
    await leftover(path.join(stepDir, `.clock-probe.999999998.${HEX}`), 1_000); // a sweep running now
    await writeStepRecords(dir, 1, [{ kind: "train", env: "gsm8k", traces: [linearTrace(traceId(1))] }]);
    expect((await readdir(stepDir)).filter((n) => n.startsWith("."))).toEqual([`.clock-probe.999999998.${HEX}`]);
  });
});
