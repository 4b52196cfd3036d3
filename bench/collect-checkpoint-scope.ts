import { RowQueue } from "../coordinator/collect/row-queue.js";
import { machine, percentile, writeSection } from "./bench-report.js";

/**
 * What finding a checkpoint's scope costs the collector (while the Gym is parked, between prepare
 * and commit) as a collection's rows grow: the rows in flight and the restored rows not sent yet.
 * Side by side in one run, on the same rows: a walk of every row (as it was) and the queue's open
 * rows, put in input order (as now). Sizes via `COLLECT_SCOPE_BENCH_ROWS`.
 */
const ROWS = (process.env["COLLECT_SCOPE_BENCH_ROWS"] ?? "100000,1000000").split(",").map(Number);
const IN_FLIGHT = 64;
const ROUNDS = 21;

interface Row {
  row: { rolloutId: string };
  status: "pending" | "inflight" | "done" | "failed";
  restored: boolean;
}

export async function run(): Promise<void> {
  const lines: string[] = [];
  for (const n of ROWS) {
    const states = new Map<string, Row>();
    const rowIndex = new Map<string, number>();
    const queue = new RowQueue<Row>();
    for (let i = 0; i < n; i++) {
      const state: Row = { row: { rolloutId: `row-${i}` }, status: i < n / 2 ? "done" : "pending", restored: false };
      states.set(state.row.rolloutId, state);
      rowIndex.set(state.row.rolloutId, i);
      queue.add(state);
    }
    for (let i = 0; i < IN_FLIGHT; i++) queue.set(queue.next()!, "inflight");
    const walk = () => [...states.values()].filter((s) => s.status === "inflight" || (s.status === "pending" && s.restored));
    const kept = () => queue.open().sort((a, b) => rowIndex.get(a.row.rolloutId)! - rowIndex.get(b.row.rolloutId)!);
    if (walk().length !== IN_FLIGHT || kept().length !== IN_FLIGHT) throw new Error("scope size differs");
    const times = { walk: [] as number[], kept: [] as number[] };
    for (let round = 0; round < ROUNDS; round++) {
      for (const [name, fn] of [["walk", walk], ["kept", kept]] as const) {
        const t0 = performance.now();
        fn();
        times[name].push(performance.now() - t0);
      }
    }
    const p50 = (values: number[]) => percentile(values, 50);
    lines.push(`| ${n.toLocaleString("en")} | ${IN_FLIGHT} | ${p50(times.walk).toFixed(2)} ms | ${p50(times.kept).toFixed(3)} ms |`);
    console.log(lines.at(-1));
  }
  await writeSection(
    "collect-checkpoint-scope",
    `## Collect: finding a checkpoint's scope

Machine: ${machine()}. Command: \`npm run bench -- collect-checkpoint-scope\` (sizes via \`COLLECT_SCOPE_BENCH_ROWS\`).
The collector finds the rows a checkpoint's scope holds (in flight, or restored and not sent yet) after the prepare, while the Gym is parked. Side by side in one run on the same rows (half done, the rest pending, ${IN_FLIGHT} in flight), median of ${ROUNDS}: a walk of every row, as before, and the open rows the queue keeps as they change, sorted into input order, as now.

| rows | in flight | walk of every row | kept open rows |
| --- | --- | --- | --- |
${lines.join("\n")}`,
  );
}
