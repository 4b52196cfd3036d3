import { traceLeaves, traceSnapshotRefs } from "../../protocol/index.js";
import { invalidState } from "./errors.js";
import type { TraceRecord } from "./trace-record.js";

/** Derived views of a trace's message graph (the counting ones live in the protocol). None are stored in the record. */

export { traceLeaves as leaves, traceBranchCount as branchCount, traceTurnCount as turnCount, traceReward } from "../../protocol/index.js";

/** Root→leaf node-index paths, one per leaf, in leaf order. */
export function branches(trace: TraceRecord): number[][] {
  return traceLeaves(trace).map((leaf) => {
    const path: number[] = [];
    for (let i: number | null = leaf; i !== null; i = trace.nodes[i]!.parent) path.push(i);
    return path.reverse();
  });
}

/**
 * `info.snapshots` maps a node index (as a string) to an opaque sandbox ref.
 * A malformed map is a producer bug, so it fails loudly instead of silently offering no anchors.
 */
export function snapshotRefs(trace: TraceRecord): Map<number, string> {
  const refs = traceSnapshotRefs(trace);
  if (typeof refs === "string") throw invalidState(`trace ${trace.id}: ${refs}`);
  return refs;
}
