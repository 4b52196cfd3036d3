/**
 * The capture ledger's append with and without its fdatasync (`npx tsx bench/ledger-append-durability.ts [dir]`):
 * per-append latency (what each model call's response end waits for) and appends per second, for
 * one key at a time, 64 keys at once (64 rollouts' calls finishing together), and 64 appends of one
 * key at once (sharing syncs). The directory should be on the ledger's real disk; default: the OS temp dir.
 */
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { CaptureLedger, type LedgerRow } from "../participants/kinds/model/index.js";

const base = process.argv[2] ?? tmpdir();
const ROUNDS = 50;

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

function percentile(values: number[], p: number): number {
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]!;
}

async function scenario(label: string, sync: "fdatasync" | "none", keysAtOnce: (round: number) => string[], report: boolean): Promise<void> {
  const dir = await mkdtemp(join(base, "gym-ckpt-ledger-bench-"));
  const ledger = new CaptureLedger(dir, 16, 256, sync === "none" ? { sync: () => Promise.resolve() } : {});
  let n = 0;
  try {
    // Warm-up: every key's file created and its descriptor open (steady state of a long run).
    await Promise.all([...new Set(keysAtOnce(0))].map((key) => ledger.append(row(key, n++))));
    const latencies: number[] = [];
    const started = process.hrtime.bigint();
    for (let round = 1; round <= ROUNDS; round++) {
      await Promise.all(
        keysAtOnce(round).map(async (key) => {
          const t = process.hrtime.bigint();
          await ledger.append(row(key, n++));
          latencies.push(Number(process.hrtime.bigint() - t) / 1e3);
        }),
      );
    }
    const ms = Number(process.hrtime.bigint() - started) / 1e6;
    if (report) console.log(
      `${label.padEnd(24)} ${sync.padEnd(9)} appends=${String(latencies.length).padStart(5)}  p50=${percentile(latencies, 0.5).toFixed(0).padStart(6)} µs  p99=${percentile(latencies, 0.99).toFixed(0).padStart(6)} µs  ${Math.round((latencies.length / ms) * 1000).toString().padStart(7)} appends/s`,
    );
  } finally {
    await ledger.close();
    await rm(dir, { recursive: true, force: true });
  }
}

const oneKey = () => ["r-0"];
const manyKeys = () => Array.from({ length: 64 }, (_, i) => `r-${i}`);
const sameKey = () => Array.from({ length: 64 }, () => "r-0");
// A first pass warms the JIT up, unreported; then each scenario without and with the sync, side by side.
for (const report of [false, true]) {
  for (const [label, keys] of [["1 key, serial", oneKey], ["64 keys at once", manyKeys], ["64 appends of 1 key", sameKey]] as const) {
    for (const sync of ["none", "fdatasync"] as const) await scenario(label, sync, keys, report);
  }
}
