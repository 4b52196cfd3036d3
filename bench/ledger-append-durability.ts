/**
 * `npm run bench -- ledger-append-durability`: the capture ledger's append with and without its
 * fdatasync, side by side in one run: per-append latency (what each model call's response end waits
 * for) and appends per second, for one key at a time, 64 keys at once (64 rollouts' calls finishing
 * together), and 64 appends of one key at once (sharing syncs). The ledger directory goes under
 * LEDGER_BENCH_DIR (default: the OS temp dir), which should be on the ledger's real disk.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CaptureLedger, type LedgerRow } from "../participants/kinds/model/index.js";
import { machine, percentile, writeSection } from "./bench-report.js";

const ROUNDS = 50;

interface Measured {
  p50: number;
  p99: number;
  perSecond: number;
}

const row = (capture_key: string, n: number): LedgerRow => ({
  capture_key,
  model_call_id: `mc-${n.toString().padStart(36, "0")}`,
  parent_call_id: `mc-${(n - 1).toString().padStart(36, "0")}`,
  continued_from: null,
  route: "/v1/chat/completions",
  staging_key: `stage/${capture_key}/${n}`,
  usage: { prompt_tokens: 812, completion_tokens: 96, total_tokens: 908 },
  recorded_at: 1_700_000_000.123,
});

async function measure(base: string, synced: boolean, keysAtOnce: () => string[]): Promise<Measured> {
  const dir = await mkdtemp(join(base, "gym-ckpt-ledger-bench-"));
  // "none" is the same ledger with a no-op sync: the append as it was before rows were synced.
  const ledger = new CaptureLedger(dir, 16, 256, synced ? {} : { sync: () => Promise.resolve() });
  let n = 0;
  try {
    // Warm-up: every key's file created and its descriptor open (a long run's steady state).
    await Promise.all([...new Set(keysAtOnce())].map((key) => ledger.append(row(key, n++))));
    const latencies: number[] = [];
    const started = process.hrtime.bigint();
    for (let round = 0; round < ROUNDS; round++) {
      await Promise.all(
        keysAtOnce().map(async (key) => {
          const t = process.hrtime.bigint();
          await ledger.append(row(key, n++));
          latencies.push(Number(process.hrtime.bigint() - t) / 1e3);
        }),
      );
    }
    const ms = Number(process.hrtime.bigint() - started) / 1e6;
    return { p50: percentile(latencies, 50), p99: percentile(latencies, 99), perSecond: (latencies.length / ms) * 1000 };
  } finally {
    await ledger.close();
    await rm(dir, { recursive: true, force: true });
  }
}

const SCENARIOS: [string, () => string[]][] = [
  ["1 key, one append at a time", () => ["r-0"]],
  ["64 keys at once (64 rollouts' calls ending together)", () => Array.from({ length: 64 }, (_, i) => `r-${i}`)],
  ["64 appends of 1 key at once (sharing syncs)", () => Array.from({ length: 64 }, () => "r-0")],
];

const micro = (us: number): string => (us >= 1000 ? `${(us / 1000).toFixed(1)} ms` : `${us.toFixed(0)} µs`);

export async function run(): Promise<void> {
  const base = process.env.LEDGER_BENCH_DIR ?? tmpdir();
  const rows: string[] = [];
  // A first pass warms the JIT up, unreported; then each scenario without and with the sync, side by side.
  for (const report of [false, true]) {
    for (const [label, keys] of SCENARIOS) {
      const none = await measure(base, false, keys);
      const synced = await measure(base, true, keys);
      if (!report) continue;
      const line = `| ${label} | ${micro(none.p50)} / ${micro(none.p99)} | ${micro(synced.p50)} / ${micro(synced.p99)} | ${Math.round(none.perSecond)} → ${Math.round(synced.perSecond)} |`;
      console.log(line);
      rows.push(line);
    }
  }
  await writeSection(
    "ledger-append-durability",
    `## Capture ledger: append with and without its fdatasync

Machine: ${machine()}. Command: \`npm run bench -- ledger-append-durability\` (directory: \`LEDGER_BENCH_DIR\`, default the OS temp dir). ${ROUNDS} rounds per scenario after an unreported warm-up pass; "no sync" is the same ledger with a no-op sync (the append before rows were synced), measured side by side in one run.

| scenario | no sync p50 / p99 | fdatasync p50 / p99 | appends/s, no sync → fdatasync |
| --- | --- | --- | --- |
${rows.join("\n")}

The sync is per model call (one row per call, never per token) and runs in the thread pool, so the event loop keeps serving; a call's response end waits for it: a fraction of a millisecond alone, a few with many calls ending at once, against model calls of tens of milliseconds to minutes.`,
  );
}
