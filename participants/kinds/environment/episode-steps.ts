import { CheckpointError, captureKey, type EpisodeId } from "../../../protocol/index.js";
import { monotonicNow, systemClock, type Clock } from "../../control-plane/clock.js";
import { AdmissionGate } from "./admission-gate.js";
import { ParkBackoff } from "./park-backoff.js";

/**
 * The episode step tracker (protocol §5.1), shared by the environment participant and the agent's
 * legacy `/run` mode.
 *
 * An episode is a sequence of steps; after each completed step its owner records a boundary (an
 * opaque JSON object: the next step plus what it needs). A step still running when admission
 * closes is either
 *   - `wait`:   the checkpoint waits for it; the boundary after it is recorded and the episode parks;
 *   - `replay`: the checkpoint does not wait; the episode counts as parked at the boundary before the
 *               step, which runs again after a crash;
 *   - `model`:  a policy call (the legacy agent loop): `replay` while it runs (a held response arrives
 *               only after resume; an undelivered call is re-issued), but once its response arrived
 *               the model counts the call as delivered and exports it, so, as after a `wait` step,
 *               the boundary before it is stale and the episode blocks until its next one.
 * Time parked for a checkpoint is not counted against the episode deadline.
 */
export type StepMode = "wait" | "replay" | "model";
export type EpisodeState = "running" | "wait_step" | "replay_step" | "parked";
export type Boundary = Record<string, unknown>;

/**
 * A deep copy of a boundary (JSON values; a `__proto__` key stays a key). Episode code gets and
 * gives copies, so nothing it mutates later changes the boundary a checkpoint exports.
 */
export function copyBoundary(boundary: Boundary): Boundary {
  return JSON.parse(JSON.stringify(boundary)) as Boundary;
}

/** What episode code sees: its identity, its continuation and the step/boundary calls. */
export interface StepEpisode {
  readonly id: EpisodeId;
  readonly key: string;
  /** Aborted by retire (reason: `stale_attempt`) or by the episode deadline (`deadline_exceeded`). */
  readonly signal: AbortSignal;
  /** A copy of the restored boundary, handed over exactly once; null for a fresh episode and afterwards. */
  continuation(): Boundary | null;
  /** Records a completed step; parks here while a checkpoint is open. */
  boundary(boundary: Boundary): Promise<void>;
  /**
   * Runs one step in `wait`, `replay` or `model` mode. A step does not start while a checkpoint is
   * open, except right after a finished wait or model step: its boundary is not recorded yet, so the
   * episode still blocks the checkpoint and goes on to its next boundary.
   */
  step<T>(mode: StepMode, fn: (signal: AbortSignal) => Promise<T>): Promise<T>;
  /**
   * Parks at the latest boundary until admission reopens (used when a callee refused with
   * `admission_closed`). Right after a finished wait or model step (no boundary since) it cannot park
   * there: it waits a short while as a blocker, also while admission is closed, and the call is retried.
   * The short wait is 100 ms, doubled per refusal in a row up to 2 s, each jittered to between half and
   * all of it (`ParkBackoff`); a step that
   * ran or a boundary starts it over.
   */
  park(): Promise<void>;
  /**
   * The episode cannot be captured (e.g. a restart-only resources server); takes effect only while
   * no checkpoint is open. While one is open it waits for resume where the episode does not block
   * (right after a replay step, before its boundary); anywhere else it throws `invalid_phase`,
   * changing nothing.
   */
  markRestart(): Promise<void>;
  /**
   * Runs a call bounded by `ms` of time outside checkpoints (its signal aborts with
   * `deadline_exceeded`), not by the episode's signal: clean-up of a failed episode that a callee
   * may park until resume, such as a resources server's `close_session`.
   */
  timed<T>(ms: number, fn: (signal: AbortSignal) => Promise<T>): Promise<T>;
  /**
   * Final clean-up: retire (and the episode deadline) waits for it instead of interrupting it, and
   * stops the episode once it ends. It waits at the latest boundary
   * while a checkpoint is open, except right after a finished wait or model step (as `step`).
   */
  finishing<T>(fn: () => Promise<T>): Promise<T>;
}

export interface ExportableEpisode<D> {
  id: EpisodeId;
  boundary: Boundary | null;
  data: D;
}

export interface RunOptions<D> {
  data: D;
  /** The boundary a restored episode starts from; it is also what gets exported until a new one is recorded. */
  restoredBoundary?: Boundary | null;
  /** Episode deadline; checkpoint pauses do not count. */
  timeoutMs?: number;
}

interface Tracked<D> {
  id: EpisodeId;
  key: string;
  data: D;
  state: EpisodeState;
  boundary: Boundary | null;
  continuation: Boundary | null;
  restart: boolean;
  retiring: boolean;
  finishing: boolean;
  /** A wait or model step finished since the last boundary: that boundary is stale, so the episode may not park on it. */
  dirty: boolean;
  /** The wait before a refused call is retried, growing while its callee keeps refusing. */
  backoff: ParkBackoff;
  abort: AbortController;
  done: Promise<void>;
  /** Remaining episode time and when the current countdown started (undefined while suspended). */
  remainingMs: number | undefined;
  countdownSince: number | undefined;
  cancelTimer: (() => void) | undefined;
}

export class EpisodeSteps<D = undefined> {
  private readonly tracked = new Map<string, Tracked<D>>();
  /** The same episodes by rollout id: starts and retires look up one rollout, never scan them all. */
  private readonly byRollout = new Map<string, Set<Tracked<D>>>();
  readonly gate: AdmissionGate;
  private readonly clock: Clock;

  constructor(
    private readonly onChange: () => void = () => undefined,
    clock: Clock = systemClock,
  ) {
    this.clock = clock;
    this.gate = new AdmissionGate(clock);
  }

  get size(): number {
    return this.tracked.size;
  }

  /** Now on the clock an episode's time budget runs on: a duration, which a wall-clock step must neither end nor stretch. */
  private elapsed(): number {
    return monotonicNow(this.clock);
  }

  has(episode: EpisodeId): boolean {
    return this.tracked.has(captureKey(episode));
  }

  /** Tracked episodes of a rollout (any attempt). */
  ofRollout(rolloutId: string): EpisodeId[] {
    return [...(this.byRollout.get(rolloutId) ?? [])].map((t) => t.id);
  }

  states(): Record<EpisodeState, number> {
    const counts: Record<EpisodeState, number> = { running: 0, wait_step: 0, replay_step: 0, parked: 0 };
    for (const t of this.tracked.values()) counts[t.state] += 1;
    return counts;
  }

  /** How many `exportable()` episodes are parked and how many are inside a replay step. */
  exportableCounts(): { parked: number; replay_step: number } {
    const counts = { parked: 0, replay_step: 0 };
    for (const t of this.tracked.values()) {
      if (this.isExportable(t)) counts[t.state as "parked" | "replay_step"] += 1;
    }
    return counts;
  }

  /** Blocking = (running or in a wait step) and not a restart, or retired but not yet stopped. */
  blockers(): string[] {
    return [...this.tracked.values()].filter((t) => this.isBlocker(t)).map((t) => t.key);
  }

  restarts(): string[] {
    return [...this.tracked.values()].filter((t) => t.restart && !t.retiring).map((t) => t.key);
  }

  /** Parked or inside a replay step, neither retiring nor a restart: exported at the latest boundary. */
  exportable(): ExportableEpisode<D>[] {
    return [...this.tracked.values()].filter((t) => this.isExportable(t)).map((t) => ({ id: t.id, boundary: t.boundary, data: t.data }));
  }

  close(): void {
    if (this.gate.closed) return;
    const now = this.elapsed();
    for (const t of this.tracked.values()) this.suspend(t, now);
    this.gate.close();
    this.onChange();
  }

  open(): void {
    if (!this.gate.closed) return;
    this.gate.open();
    for (const t of this.tracked.values()) this.schedule(t);
    this.onChange();
  }

  /**
   * Tracks one episode while `fn` runs it. A second start of a tracked attempt is refused with
   * `stale_attempt`. The episode stays tracked until `fn` settles, so an interrupted retire can retry.
   */
  run<T>(episode: EpisodeId, options: RunOptions<D>, fn: (episode: StepEpisode) => Promise<T>): Promise<T> {
    const key = captureKey(episode);
    if (this.tracked.has(key)) throw new CheckpointError("stale_attempt", `${key} is already running here`);
    let finished!: () => void;
    const t: Tracked<D> = {
      id: episode,
      key,
      data: options.data,
      state: "running",
      boundary: options.restoredBoundary ?? null,
      continuation: options.restoredBoundary ?? null,
      restart: false,
      retiring: false,
      finishing: false,
      dirty: false,
      backoff: new ParkBackoff(this.clock),
      abort: new AbortController(),
      done: new Promise<void>((resolve) => (finished = resolve)),
      remainingMs: options.timeoutMs,
      countdownSince: undefined,
      cancelTimer: undefined,
    };
    this.tracked.set(key, t);
    const ofRollout = this.byRollout.get(episode.rollout_id);
    if (ofRollout) ofRollout.add(t);
    else this.byRollout.set(episode.rollout_id, new Set([t]));
    if (!this.gate.closed) this.schedule(t);
    this.onChange();
    const handle = this.handle(t);
    const work = (async () => {
      // A restored episode admitted while admission is still closed waits at its boundary.
      if (this.gate.closed) await handle.park();
      return fn(handle);
    })();
    return work.finally(() => {
      t.cancelTimer?.();
      this.tracked.delete(key);
      const ofRollout = this.byRollout.get(episode.rollout_id);
      ofRollout?.delete(t);
      if (ofRollout?.size === 0) this.byRollout.delete(episode.rollout_id);
      finished();
      this.onChange();
    });
  }

  /**
   * Resolves once every retired episode of these rollouts still tracked has ended: a retire cut
   * short by its deadline leaves them running, and a forget must not lift their fences before.
   */
  async retiredEnded(rolloutIds: string[]): Promise<void> {
    const running = rolloutIds.flatMap((id) => [...(this.byRollout.get(id) ?? [])].filter((t) => t.retiring));
    await Promise.all(running.map((t) => t.done));
  }

  /**
   * Retire: stops every tracked episode of these rollouts with attempt ≤ the given one (once), and
   * waits until each has ended. Final clean-up in progress is waited for, not interrupted.
   */
  async retire(episodes: EpisodeId[]): Promise<void> {
    const targets = new Set<Tracked<D>>();
    for (const e of episodes) {
      for (const t of this.byRollout.get(e.rollout_id) ?? []) if (t.id.attempt <= e.attempt) targets.add(t);
    }
    for (const t of targets) {
      if (!t.retiring) {
        t.retiring = true;
        if (!t.finishing) t.abort.abort(new CheckpointError("stale_attempt", `${t.key} was retired`));
      }
    }
    if (targets.size) this.onChange();
    await Promise.all([...targets].map((t) => t.done));
  }

  private handle(t: Tracked<D>): StepEpisode {
    const setState = (state: EpisodeState) => {
      if (t.state === state) return;
      t.state = state;
      this.onChange();
    };
    const park = async () => {
      // Parked = exported at the latest boundary; after a finished wait step that boundary would
      // replay the step, so the episode waits as a blocker instead.
      setState(t.dirty ? "running" : "parked");
      try {
        if (t.dirty) {
          // A blocker: the checkpoint's prepare waits for it to reach its next boundary, so it never
          // waits for our own admission to reopen (that waits for the prepare, which waits for it).
          // The refused call is retried after a short wait, as while our admission is open.
          await this.gate.nextChange(t.abort.signal, t.backoff.next());
          return;
        }
        if (!this.gate.closed) {
          // Our own admission is open but a callee refused: wait briefly (or for the checkpoint to reach us).
          await this.gate.nextChange(t.abort.signal, t.backoff.next());
        }
        await this.gate.waitOpen(t.abort.signal);
      } finally {
        // Aborted too: an episode on its way out is neither exported nor done.
        setState("running");
      }
    };
    return {
      id: t.id,
      key: t.key,
      signal: t.abort.signal,
      continuation: () => {
        const c = t.continuation;
        t.continuation = null;
        // A copy: the restored boundary is still what a checkpoint exports until the next one.
        return c && copyBoundary(c);
      },
      boundary: async (boundary) => {
        t.abort.signal.throwIfAborted();
        t.boundary = copyBoundary(boundary);
        t.continuation = null;
        t.dirty = false;
        t.backoff.reset();
        if (this.gate.closed) await park();
        else setState("running");
      },
      step: async (mode, fn) => {
        t.abort.signal.throwIfAborted();
        // Not at a stale boundary: the checkpoint waits for this episode anyway (it blocks), so its
        // next step runs (callees close after this stage) until it records a boundary and parks there.
        if (this.gate.closed && !t.dirty) await park();
        // A replay step after a finished step (no boundary between) blocks too: its boundary is stale.
        setState(mode === "wait" ? "wait_step" : t.dirty ? "running" : "replay_step");
        let ok = false;
        try {
          const result = await fn(t.abort.signal);
          ok = true;
          // Its callee took the call: a later refusal is retried after the shortest wait again.
          t.backoff.reset();
          // A model response that got here was delivered, even one arriving while admission is closed
          // (the model closes first and lets a started response finish), so it must not be replayed.
          if (mode !== "replay") t.dirty = true;
          return result;
        } finally {
          // A replay step stays non-blocking until its boundary is recorded (the owner records it next);
          // a failed step blocks: the episode is ending, not exportable at a boundary.
          if (mode !== "replay" || !ok) setState("running");
        }
      },
      park,
      markRestart: async () => {
        t.abort.signal.throwIfAborted();
        // The exported set and the restart set never change during a checkpoint, so it waits for
        // resume; but waiting where the episode blocks would hold the prepare to its deadline.
        if (this.gate.closed && this.isBlocker(t)) {
          throw new CheckpointError("invalid_phase", `${t.key}: markRestart while a checkpoint is open only where the episode does not block it (right after a replay step, before its boundary)`);
        }
        await this.gate.waitOpen(t.abort.signal);
        t.restart = true;
        this.onChange();
      },
      timed: (ms, fn) => this.gate.withOpenTimeout(ms, () => new CheckpointError("deadline_exceeded", `${t.key}: a clean-up call took longer than ${ms} ms`), fn),
      finishing: async (fn) => {
        t.abort.signal.throwIfAborted();
        // As a step: right after a finished wait or model step it blocks anyway (parking would wait
        // for resume as a blocker, holding the prepare to its deadline), so it runs on and ends.
        if (this.gate.closed && !t.dirty) await park();
        t.finishing = true;
        setState("running");
        try {
          return await fn();
        } finally {
          t.finishing = false;
          // A retire or deadline that came during clean-up was only deferred, not dropped: the
          // retire waits for the episode to end, so nothing it does after this may run on.
          if (t.retiring) t.abort.abort(new CheckpointError("stale_attempt", `${t.key} was retired`));
          else if (this.remainingMs(t.id) === 0) t.abort.abort(new CheckpointError("deadline_exceeded", `episode ${t.key} ran out of time`));
        }
      },
    };
  }

  private isBlocker(t: Tracked<D>): boolean {
    return t.retiring || (!t.restart && (t.state === "running" || t.state === "wait_step"));
  }

  private isExportable(t: Tracked<D>): boolean {
    return !t.retiring && !t.restart && (t.state === "parked" || t.state === "replay_step");
  }

  private schedule(t: Tracked<D>): void {
    if (t.remainingMs === undefined || t.countdownSince !== undefined) return;
    t.countdownSince = this.elapsed();
    t.cancelTimer = this.clock.setTimer(() => {
      if (!t.finishing) t.abort.abort(new CheckpointError("deadline_exceeded", `episode ${t.key} ran out of time`));
    }, t.remainingMs);
  }

  private suspend(t: Tracked<D>, now: number): void {
    if (t.remainingMs === undefined || t.countdownSince === undefined) return;
    t.cancelTimer?.();
    t.cancelTimer = undefined;
    t.remainingMs = Math.max(0, t.remainingMs - (now - t.countdownSince));
    t.countdownSince = undefined;
  }

  /** Remaining episode time (ms), for tests and status; undefined without a deadline. */
  remainingMs(episode: EpisodeId): number | undefined {
    const t = this.tracked.get(captureKey(episode));
    if (!t || t.remainingMs === undefined) return undefined;
    return t.countdownSince === undefined ? t.remainingMs : Math.max(0, t.remainingMs - (this.elapsed() - t.countdownSince));
  }
}
