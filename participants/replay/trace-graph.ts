import { invalidState } from "./errors.js";
import type { TraceRecord } from "./trace-record.js";

/** Derived views of a trace's message graph. None of these are stored in the record. */

/** Leaves in node-index order: nodes no other node names as parent. */
export function leaves(trace: TraceRecord): number[] {
  const hasChild = new Array<boolean>(trace.nodes.length).fill(false);
  for (const node of trace.nodes) if (node.parent !== null) hasChild[node.parent] = true;
  const out: number[] = [];
  hasChild.forEach((child, i) => {
    if (!child) out.push(i);
  });
  return out;
}

/** Root→leaf node-index paths, one per leaf, in leaf order. */
export function branches(trace: TraceRecord): number[][] {
  return leaves(trace).map((leaf) => {
    const path: number[] = [];
    for (let i: number | null = leaf; i !== null; i = trace.nodes[i]!.parent) path.push(i);
    return path.reverse();
  });
}

export function branchCount(trace: TraceRecord): number {
  return leaves(trace).length;
}

/** Turns are model calls: sampled nodes over the whole trace. */
export function turnCount(trace: TraceRecord): number {
  return trace.nodes.reduce((n, node) => n + (node.sampled ? 1 : 0), 0);
}

/** The rollout reward is the sum of the weighted reward contributions. */
export function traceReward(trace: TraceRecord): number {
  let sum = 0;
  for (const value of Object.values(trace.rewards)) sum += value;
  return sum;
}

/**
 * `info.snapshots` maps a node index (as a string) to an opaque sandbox ref.
 * A malformed map is a producer bug, so it fails loudly instead of silently offering no anchors.
 */
export function snapshotRefs(trace: TraceRecord): Map<number, string> {
  const raw = trace.info?.["snapshots"];
  const refs = new Map<number, string>();
  if (raw === undefined || raw === null) return refs;
  if (typeof raw !== "object" || Array.isArray(raw)) {
    throw invalidState(`trace ${trace.id}: info.snapshots must be an object`);
  }
  for (const [key, ref] of Object.entries(raw)) {
    const index = Number(key);
    if (!/^(0|[1-9][0-9]*)$/.test(key) || index >= trace.nodes.length || typeof ref !== "string") {
      throw invalidState(`trace ${trace.id}: info.snapshots has a bad entry ${JSON.stringify(key)}`);
    }
    refs.set(index, ref);
  }
  return refs;
}
