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

/**
 * A kind's export: of the items it would export, those of each rollout's highest attempt (its
 * current one: the controller dispatched it after the others, which it never retired here), so a
 * checkpoint never holds one rollout at two attempts (its restore would refuse them above). Items
 * of the same attempt (several sessions of one attempt) are all kept; the order is kept.
 */
export function currentAttemptsOnly<T>(items: readonly T[], episodeOf: (item: T) => EpisodeId): T[] {
  const highest = new Map<string, number>();
  for (const item of items) {
    const { rollout_id, attempt } = episodeOf(item);
    if (attempt > (highest.get(rollout_id) ?? -1)) highest.set(rollout_id, attempt);
  }
  return items.filter((item) => episodeOf(item).attempt === highest.get(episodeOf(item).rollout_id));
}
