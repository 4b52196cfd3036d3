import { captureKey, type EpisodeId } from "../../protocol/index.js";

/**
 * Retired attempts, per rollout the highest retired attempt. Any attempt at or below the mark is
 * refused with `stale_attempt`. Marks outlive the retire (a caller's last request can arrive after
 * it on another connection) and are lifted only by `forget`.
 */
export class RetiredMarks {
  private readonly marks = new Map<string, number>();

  mark(episode: EpisodeId): void {
    const current = this.marks.get(episode.rollout_id);
    if (current === undefined || episode.attempt > current) this.marks.set(episode.rollout_id, episode.attempt);
  }

  isRetired(episode: EpisodeId): boolean {
    const mark = this.marks.get(episode.rollout_id);
    return mark !== undefined && episode.attempt <= mark;
  }

  forget(rolloutId: string): boolean {
    return this.marks.delete(rolloutId);
  }

  get size(): number {
    return this.marks.size;
  }

  describe(episode: EpisodeId): string {
    return `${captureKey(episode)} was retired (attempts <= ${this.marks.get(episode.rollout_id)} are fenced until forget)`;
  }
}
