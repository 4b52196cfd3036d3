/**
 * What the environment server digests for a replayed `/run` (the restore digest its checkpoint
 * records keep): the task together with the replay task it ran, so a restore continues only under
 * that replay task. `seeds --tasks` finds a replayed episode's task through the same spelling.
 */
export function replayRunDigestInput(task: unknown, run: { replay_idx: number; replay_id: string }): { task: unknown; replay_idx: number; replay_id: string } {
  return { task, replay_idx: run.replay_idx, replay_id: run.replay_id };
}
