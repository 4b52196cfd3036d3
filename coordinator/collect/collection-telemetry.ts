import { metrics } from "@opentelemetry/api";

/** Collection rows by state, as a gauge read when metrics are collected. */
export type RowCounts = Record<"pending" | "inflight" | "done" | "failed", number>;

/**
 * `gym_ckpt.collection.rows{state}` and `gym_ckpt.collection.checkpoints{outcome}`; spans of the
 * collector are `checkpoint.collection.checkpoint` and `checkpoint.collection.restore`.
 */
export function collectionInstruments(counts: () => RowCounts) {
  const meter = metrics.getMeter("gym-ckpt");
  const byState = meter.createObservableGauge("gym_ckpt.collection.rows", { unit: "{row}", description: "Collection rows by state" });
  byState.addCallback((result) => {
    for (const [state, value] of Object.entries(counts())) result.observe(value, { state });
  });
  const checkpoints = meter.createCounter("gym_ckpt.collection.checkpoints", { unit: "{checkpoint}", description: "Collector checkpoints by outcome (published, not_prepared, failed)" });
  const rows = meter.createCounter("gym_ckpt.collection.rows.resumed", { unit: "{row}", description: "Rows after a restart: continued from a checkpoint or restarted from input" });
  return { checkpoints, rows };
}
