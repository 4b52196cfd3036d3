import type { EpisodeId } from "../../../protocol/index.js";

/** The resumed fence's size and the kept commit replies' count, as participants/control-plane/control-plane.ts keeps them. */
const FENCE_CAPACITY = 64;
const RESUMED_COMMITS_KEPT = 4;

/**
 * What one participant process remembers of the checkpoints it took part in, as a real one's
 * control plane does (participants/control-plane/control-plane.ts, resumed-fence.ts): the ids it
 * resumed (the resumed fence: a later prepare, commit, renew or restore of one is
 * `stale_checkpoint`), the commit reply of its last 4 resumed after they committed (a commit
 * re-driven for one is answered from it), and whether it holds live state (a restore needs a fresh
 * process: `invalid_checkpoint_state`). A restarted process remembers nothing (a new instance).
 */
export class ParticipantMemory {
  /** Oldest first, as ResumedFence's insertion order. */
  private readonly fence = new Set<string>();
  /** The commit reply (and its arguments) of each checkpoint committed here, while it is active. */
  private readonly commits = new Map<string, { args: string; reply: string }>();
  private readonly resumedCommits = new Map<string, { args: string; reply: string }>();
  /** Sessions, episodes or restored state here (the kind's hasLiveState): it served, or a restore installed. */
  live = false;
  /**
   * The attempt marks (control-plane AttemptMarks: per rollout the highest fenced attempt): retired
   * ones, and the source attempts a restore here continued as their next. Lifted only by forget.
   */
  private readonly retiredMarks = new Map<string, number>();
  private readonly restoredFromMarks = new Map<string, number>();

  /** control-plane retire's `this.retired.mark(episode)` (also abandonLateInstall's mark of attempt+1). */
  retire(episodes: readonly EpisodeId[]): void {
    for (const e of episodes) mark(this.retiredMarks, e);
  }

  /** control-plane restore, once installed: `this.restoredFrom.mark(episode)` for every episode in scope. */
  continuedAsNext(episodes: readonly EpisodeId[]): void {
    for (const e of episodes) mark(this.restoredFromMarks, e);
  }

  /** control-plane forget: both marks of each rollout lifted. */
  forget(rollouts: readonly string[]): void {
    for (const r of rollouts) {
      this.retiredMarks.delete(r);
      this.restoredFromMarks.delete(r);
    }
  }

  /** control-plane isRetired (the data plane's stale_attempt): retired, or continued here as a later attempt. */
  fencedAttempt(episode: EpisodeId): boolean {
    return covers(this.retiredMarks, episode) || covers(this.restoredFromMarks, episode);
  }

  /** Retired (a retire's mark, not a restore's continuation). */
  retiredAttempt(episode: EpisodeId): boolean {
    return covers(this.retiredMarks, episode);
  }

  fenced(id: string): boolean {
    return this.fence.has(id);
  }

  /** Resume (also of an id not held here, while idle), or a lease expiry, of `id` (control-plane reopen): fenced, its commit reply kept. */
  reopen(id: string): void {
    this.fence.delete(id);
    this.fence.add(id);
    while (this.fence.size > FENCE_CAPACITY) this.fence.delete(this.fence.values().next().value as string);
    const committed = this.commits.get(id);
    if (committed) {
      this.resumedCommits.set(id, committed);
      for (const kept of this.resumedCommits.keys()) if (this.resumedCommits.size > RESUMED_COMMITS_KEPT) this.resumedCommits.delete(kept);
    }
    this.commits.delete(id);
  }

  committed(id: string, args: string, reply: string): void {
    this.commits.set(id, { args, reply });
  }

  /**
   * control-plane cached(id, "commit", args): the reply a commit of `id` gets before admission
   * (its own while active, or a kept one while fenced), `checkpoint_conflict` for other arguments.
   */
  cachedCommit(id: string, args: string): { reply: string } | { conflict: string } | undefined {
    const entry = this.commits.get(id) ?? (this.fence.has(id) ? this.resumedCommits.get(id) : undefined);
    if (!entry) return undefined;
    if (entry.args !== args) return { conflict: `a retried commit of ${id} must name the same directory and scope and stop flag` };
    return { reply: entry.reply };
  }

  /** A restore of `id` installed here: its commit reply (if this process made it) is no longer the state here. */
  restored(id: string): void {
    this.resumedCommits.delete(id);
    this.live = true;
  }
}

/** AttemptMarks.mark: the highest attempt per rollout. */
function mark(marks: Map<string, number>, episode: EpisodeId): void {
  const current = marks.get(episode.rollout_id);
  if (current === undefined || episode.attempt > current) marks.set(episode.rollout_id, episode.attempt);
}

/** AttemptMarks.has: any attempt at or below the mark. */
function covers(marks: Map<string, number>, episode: EpisodeId): boolean {
  const m = marks.get(episode.rollout_id);
  return m !== undefined && episode.attempt <= m;
}
