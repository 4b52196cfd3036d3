import { captureKey, type EpisodeId } from "../../protocol/index.js";

/**
 * Fenced attempts, per rollout the highest fenced attempt: any attempt at or below the mark is
 * refused with `stale_attempt`. Marks are lifted only by `forget`. The control plane keeps two
 * sets: retired attempts (a caller's last request can arrive after the retire on another
 * connection), and the source attempts of the restore installed here (a restored episode
 * continues as its next attempt, never under its old identity).
 */
export class AttemptMarks {
  private readonly marks = new Map<string, number>();

  /** `why` completes the refusal text: "<capture key> <why>". */
  constructor(private readonly why: string) {}

  mark(episode: EpisodeId): void {
    const current = this.marks.get(episode.rollout_id);
    if (current === undefined || episode.attempt > current) this.marks.set(episode.rollout_id, episode.attempt);
  }

  has(episode: EpisodeId): boolean {
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
    return `${captureKey(episode)} ${this.why} (attempts <= ${this.marks.get(episode.rollout_id)} are fenced until forget)`;
  }
}

/**
 * Whether a retire of `episodes` covers an attempt: its rollout named at that attempt or a later
 * one. One lookup per question: a retire may name 100,000 episodes, and scanning them for each
 * session a kind holds would make a retire quadratic (16,000 sessions would take a second of event loop).
 */
export function retiredBy(episodes: Iterable<EpisodeId>): (episode: EpisodeId) => boolean {
  const marks = new AttemptMarks("is retired");
  for (const episode of episodes) marks.mark(episode);
  return (episode) => marks.has(episode);
}

/** The `stale_attempt` detail of a fenced attempt (the kinds see only that it is fenced, not why). */
export function fencedAttempt(key: string): string {
  return `${key} was retired, or a restore here continues it as a later attempt`;
}
