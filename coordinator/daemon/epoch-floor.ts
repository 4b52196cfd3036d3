import type { Logger } from "pino";

export interface EpochsInUse {
  /** The highest epoch a published checkpoint carries (its checkpoint root); may throw (unreadable root). */
  published(): number;
  /** The highest epoch a registered participant reports having seen (a bounded status probe). */
  seen(): Promise<number>;
}

/**
 * The daemon's epoch floor (LeaderLease's `epochFloor`): the highest epoch already in use, published
 * or seen by a participant. Participants may have seen a later epoch than any published (a term that
 * published nothing): they would refuse a leader below it (stale_epoch) until restarted. A source
 * that fails counts as 0 (no floor rather than no leader), and so does one no later epoch can pass
 * (2^53 - 1, a hand-edited checkpoint.json): as the floor, the lease would ignore it whole, the
 * other source with it.
 */
export async function highestEpochInUse(sources: EpochsInUse, logger: Logger): Promise<number> {
  let published = 0;
  try {
    published = sources.published();
  } catch (err) {
    // Publication reports the root itself.
    logger.warn({ err }, "epoch_floor_unreadable");
  }
  if (!Number.isSafeInteger(published + 1)) {
    logger.error({ highest_published_epoch: published }, "published_epoch_out_of_range_ignored");
    published = 0;
  }
  const seen = await sources.seen().catch((err: unknown) => {
    logger.warn({ err }, "participant_epochs_unread");
    return 0;
  });
  if (seen > published) logger.info({ highest_published_epoch: published, highest_participant_epoch: seen }, "participants_saw_unpublished_epoch");
  return Math.max(published, seen);
}
