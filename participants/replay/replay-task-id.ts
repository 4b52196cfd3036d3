import { canonicalDigest } from "../../protocol/index.js";
import type { ReplayTask } from "./replay-task-source.js";

/**
 * A replayed task's content id: the sha256 (hex) of what makes it this task and no other, namely
 * where it came from (trace, step, line, anchor) and the seeded context. Every anchor of one record
 * shares the source task, so the task alone cannot tell them apart, and a position (`replay_idx`)
 * means another task on a worker whose list differs. The file path is left out: workers may mount
 * the records at different paths.
 */
export function replayTaskId(task: ReplayTask): string {
  const { mode, anchor, sourceEnv, sourceTraceId, sourceStep, sourceOrdinal, anchorNode } = task.lineage;
  return canonicalDigest({ mode, anchor, sourceEnv, sourceTraceId, sourceStep, sourceOrdinal, anchorNode, name: task.name, prompt: task.prompt });
}
