import { CheckpointError, canonicalDigest, captureKey, nextAttempt, type EpisodeId } from "../../../protocol/index.js";
import type { Clock } from "../../control-plane/clock.js";
import { systemClock } from "../../control-plane/clock.js";
import { EpisodeSteps, type Boundary, type StepEpisode } from "./episode-steps.js";
import { fencedAttempt } from "../../control-plane/attempt-marks.js";
import { refuseTwoAttempts } from "../../control-plane/one-attempt-per-rollout.js";

/** One episode as a checkpoint stores it: the source attempt, its task digest and its boundary. */
export interface EpisodeSnapshot {
  episode_id: EpisodeId;
  task_digest: string;
  boundary: Boundary | null;
}

export interface BeginOptions {
  timeoutMs?: number;
  /**
   * Checks a restored boundary (throws a catalog refusal, e.g. `invalid_checkpoint_state`) before
   * the restored record is taken, so a boundary the episode code cannot continue from is refused
   * without losing the record.
   */
  checkBoundary?: (boundary: Boundary) => void;
  /**
   * Other spellings of the same task a restored record's digest may be of (e.g. with defaults filled
   * in, as an older server digested it): a restored record matching any of them is taken too. The
   * episode's own digest, exported by later checkpoints, stays the task's.
   */
  sameTask?: unknown[];
}

/**
 * The step tracker plus restored episodes waiting for their replacement (protocol §5.3). Used by
 * the environment participant and by the agent's legacy `/run` episodes.
 *
 * Restored records are kept under their NEXT attempt until `begin` takes them; later checkpoints
 * export them again as that attempt, so a second crash before re-dispatch continues as attempt+2.
 */
export class RestorableEpisodes {
  readonly steps: EpisodeSteps<{ taskDigest: string }>;
  /** Next-attempt capture key → record already rewritten to the next attempt. */
  private readonly pending = new Map<string, EpisodeSnapshot>();
  /** The same records by rollout id (key → record): a start or retire looks up one rollout, never scans them all. */
  private readonly pendingByRollout = new Map<string, Map<string, EpisodeSnapshot>>();

  constructor(
    private readonly isRetired: (episode: EpisodeId) => boolean,
    onChange: () => void = () => undefined,
    clock: Clock = systemClock,
  ) {
    this.steps = new EpisodeSteps(onChange, clock);
  }

  get pendingCount(): number {
    return this.pending.size;
  }

  hasLiveState(): boolean {
    return this.steps.size > 0 || this.pending.size > 0;
  }

  /**
   * Starts (or continues) an episode. Checks, in order: the retired fence (`stale_attempt`), a
   * conflicting attempt of the same rollout (`stale_attempt`), admission (`admission_closed` when
   * closed and nothing was restored for this attempt), the restored task digest (`invalid_request`;
   * the task's or one of `options.sameTask`),
   * the restored boundary (`options.checkBoundary`). All checks run before anything changes, so a
   * refusal loses nothing.
   */
  begin<T>(episode: EpisodeId, task: unknown, options: BeginOptions, fn: (episode: StepEpisode) => Promise<T>): Promise<T> {
    const key = captureKey(episode);
    if (this.isRetired(episode)) throw new CheckpointError("stale_attempt", fencedAttempt(key));
    for (const other of this.steps.ofRollout(episode.rollout_id)) {
      throw new CheckpointError("stale_attempt", `${captureKey(other)} of rollout ${episode.rollout_id} is already running here`);
    }
    for (const pending of this.pendingByRollout.get(episode.rollout_id)?.values() ?? []) {
      if (pending.episode_id.attempt > episode.attempt) {
        throw new CheckpointError("stale_attempt", `rollout ${episode.rollout_id} was restored as ${captureKey(pending.episode_id)}; ${key} is stale`);
      }
    }
    const restored = this.pending.get(key);
    if (!restored && this.steps.gate.closed) throw new CheckpointError("admission_closed", "a checkpoint is open; retry after resume");
    const taskDigest = canonicalDigest(task);
    if (restored && restored.task_digest !== taskDigest && !options.sameTask?.some((t) => canonicalDigest(t) === restored.task_digest)) {
      throw new CheckpointError("invalid_request", `${key} continues a checkpoint recorded for a different task (digest mismatch)`);
    }
    if (restored?.boundary && options.checkBoundary) options.checkBoundary(restored.boundary);
    // Taken exactly once, and only its own (protocol §5.3): a record of another attempt stays until
    // a retire drops it. A later attempt that took it would lose it if a callee then refused that
    // attempt (the agent's restored session belongs to the record's attempt), and the real
    // replacement would start from input here while the agent continues.
    this.dropPending(key, episode.rollout_id);
    return this.steps.run(
      episode,
      {
        data: { taskDigest },
        ...(restored && { restoredBoundary: restored.boundary }),
        ...(options.timeoutMs !== undefined && { timeoutMs: options.timeoutMs }),
      },
      fn,
    );
  }

  /**
   * Live episodes parked or in a replay step, plus pending restored records (as their next attempt),
   * leaving out fenced attempts as the other kinds' exports do: a restore of the checkpoint would
   * otherwise bring a retired attempt back (a retire drops them first today; this keeps the rule
   * from resting on that order). A checkpoint holds each rollout once: a pending record whose
   * rollout a later attempt runs (exported) here is left out, since its replacement has started
   * (`begin` keeps the record for a real replacement a callee's refusal may still bring).
   */
  exportSnapshots(scope: EpisodeId[] | null): EpisodeSnapshot[] {
    const wanted = scope ? new Set(scope.map(captureKey)) : undefined;
    const exported = (s: EpisodeSnapshot) => !this.isRetired(s.episode_id) && (!wanted || wanted.has(captureKey(s.episode_id)));
    const live = this.steps
      .exportable()
      .map((e) => ({ episode_id: e.id, task_digest: e.data.taskDigest, boundary: e.boundary }))
      .filter(exported);
    const liveRollouts = new Set(live.map((s) => s.episode_id.rollout_id));
    return [...live, ...[...this.pending.values()].filter((s) => exported(s) && !liveRollouts.has(s.episode_id.rollout_id))];
  }

  /** Validates the whole set first (fresh process, one attempt per rollout, no retired or duplicate targets), then installs all. */
  install(snapshots: EpisodeSnapshot[]): string[] {
    if (this.hasLiveState()) throw new CheckpointError("invalid_checkpoint_state", "restore needs a fresh process: episodes are tracked here");
    // Distinct next attempts would pass the duplicate check below, and both would continue.
    refuseTwoAttempts(snapshots);
    const next = new Map<string, EpisodeSnapshot>();
    for (const snapshot of snapshots) {
      const target = nextAttempt(snapshot.episode_id);
      const key = captureKey(target);
      if (this.isRetired(target)) throw new CheckpointError("stale_attempt", `${key} is retired; it cannot be restored`);
      if (next.has(key)) throw new CheckpointError("invalid_checkpoint_state", `two records for ${captureKey(snapshot.episode_id)}`);
      next.set(key, { episode_id: target, task_digest: snapshot.task_digest, boundary: snapshot.boundary });
    }
    for (const [key, snapshot] of next) {
      this.pending.set(key, snapshot);
      const ofRollout = this.pendingByRollout.get(snapshot.episode_id.rollout_id);
      if (ofRollout) ofRollout.set(key, snapshot);
      else this.pendingByRollout.set(snapshot.episode_id.rollout_id, new Map([[key, snapshot]]));
    }
    return [...next.keys()];
  }

  /** Commit clean-up: pending records the controller no longer continues are dropped (not fenced). */
  dropPendingOutside(scope: EpisodeId[] | null): void {
    if (!scope) return;
    const wanted = new Set(scope.map(captureKey));
    for (const [key, pending] of [...this.pending]) if (!wanted.has(key)) this.dropPending(key, pending.episode_id.rollout_id);
  }

  async retire(episodes: EpisodeId[]): Promise<void> {
    for (const e of episodes) {
      for (const [key, pending] of [...(this.pendingByRollout.get(e.rollout_id) ?? [])]) {
        if (pending.episode_id.attempt <= e.attempt) this.dropPending(key, e.rollout_id);
      }
    }
    await this.steps.retire(episodes);
  }

  private dropPending(key: string, rolloutId: string): void {
    this.pending.delete(key);
    const ofRollout = this.pendingByRollout.get(rolloutId);
    ofRollout?.delete(key);
    if (ofRollout?.size === 0) this.pendingByRollout.delete(rolloutId);
  }

  pendingKeys(): string[] {
    return [...this.pending.keys()].sort();
  }
}
