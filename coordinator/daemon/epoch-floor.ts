import type { Logger } from "pino";
import { isPassableEpoch } from "../../protocol/index.js";

export interface EpochsInUse {
  /** The highest epoch a published checkpoint carries (its checkpoint root); may throw (unreadable root). */
  published(): number;
  /** The highest epoch a registered participant reports having seen (a bounded status probe). */
  seen(): Promise<number>;
  /** The highest epoch a decision journal entry carries (bounded like `seen`). */
  journaled(): Promise<number>;
}

/**
 * The daemon's epoch floor (LeaderLease's `epochFloor`): the highest epoch already in use, published,
 * seen by a participant or journaled. Participants may have seen a later epoch than any published (a
 * term that published nothing): they would refuse a leader below it (stale_epoch) until restarted.
 * One that does not answer the probe in time is still covered when its epoch came with a journaled
 * checkpoint, the one recovery re-drives to it. A source that fails counts as 0 (no floor rather
 * than no leader), and so does an epoch no later one can pass (2^53 - 1, a hand-edited
 * checkpoint.json or journal entry): as the floor, the lease would ignore it whole, the other
 * sources with it.
 */
export async function highestEpochInUse(sources: EpochsInUse, logger: Logger): Promise<number> {
  let published = 0;
  try {
    published = sources.published();
  } catch (err) {
    // Publication reports the root itself.
    logger.warn({ err }, "epoch_floor_unreadable");
  }
  if (!isPassableEpoch(published)) {
    logger.error({ highest_published_epoch: published }, "published_epoch_out_of_range_ignored");
    published = 0;
  }
  const [seen, journaled] = await Promise.all([
    sources.seen().catch((err: unknown) => {
      logger.warn({ err }, "participant_epochs_unread");
      return 0;
    }),
    sources.journaled().then(
      (epoch) => {
        if (isPassableEpoch(epoch)) return epoch;
        logger.error({ highest_journaled_epoch: epoch }, "journaled_epoch_out_of_range_ignored");
        return 0;
      },
      (err: unknown) => {
        logger.warn({ err }, "journal_epochs_unread");
        return 0;
      },
    ),
  ]);
  if (seen > published) logger.info({ highest_published_epoch: published, highest_participant_epoch: seen }, "participants_saw_unpublished_epoch");
  if (journaled > Math.max(published, seen)) {
    logger.info({ highest_published_epoch: published, highest_participant_epoch: seen, highest_journaled_epoch: journaled }, "journal_holds_higher_epoch");
  }
  return Math.max(published, seen, journaled);
}
