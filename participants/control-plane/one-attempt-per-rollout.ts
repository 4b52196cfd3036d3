import { CheckpointError, rolloutAtTwoAttempts, type EpisodeId } from "../../protocol/index.js";

/**
 * A kind's restore validation: records holding one rollout at two attempts are refused
 * (`invalid_checkpoint_state`) before anything is installed. A checkpoint captures each rollout
 * once, at its current attempt; installed, both would continue (as attempt+1 and attempt+2) and the
 * controller could not tell which one it restored. The control plane's scope filter (one attempt
 * per rollout) keeps such a pair from reaching a kind today; this keeps the rule from resting on it.
 */
export function refuseTwoAttempts(records: readonly { episode_id: EpisodeId }[]): void {
  const two = rolloutAtTwoAttempts(records.map((r) => r.episode_id));
  if (two) {
    throw new CheckpointError(
      "invalid_checkpoint_state",
      `the records hold rollout ${two.rollout_id} at attempts ${two.low} and ${two.high}: a checkpoint captures each rollout once, at its current attempt`,
    );
  }
}
