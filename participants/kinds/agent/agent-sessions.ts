import { CheckpointError, captureKey, sameEpisode, type EpisodeId } from "../../../protocol/index.js";
import { systemClock, type Clock } from "../../control-plane/clock.js";
import { AdmissionGate } from "../environment/admission-gate.js";
import { copyBoundary, type Boundary } from "../environment/episode-steps.js";
import { ParkBackoff } from "../environment/park-backoff.js";
import { fencedAttempt, retiredBy } from "../../control-plane/attempt-marks.js";
import { AgentRecordSchema } from "./agent-record.js";

/**
 * Agent sessions parked at boundaries (protocol §7). A session is `idle` between activations,
 * `running` inside one, and `at_boundary` while parked or while it awaits a policy call made right
 * after a boundary (the policy holds that response during a checkpoint, so the loop cannot move on).
 * Once that call's response has arrived the call counts as delivered, so the session is `running`
 * again until its next boundary, even while a checkpoint is open. An activation that ends after a
 * delivered call without reporting a boundary leaves a snapshot older than that call: the session
 * is a restart (never exported) until a later activation reports a boundary.
 */
export type SessionState = "idle" | "running" | "at_boundary";

/** What an activation's turn loop sees. */
export interface Activation {
  readonly episode: EpisodeId;
  readonly sessionKey: string;
  /** Aborted by retire or close_session. */
  readonly signal: AbortSignal;
  /** A copy of the restored turn-loop snapshot, handed over once; null for a fresh session and afterwards. */
  continuation(): Boundary | null;
  /** Reports a boundary; `snapshot` runs only if a checkpoint exports the session, and must return the state as of this call. */
  boundary(snapshot: () => Boundary): Promise<void>;
  /** Awaits a policy call; counts as at the boundary when made right after one, until its response arrives. */
  awaitingModel<T>(call: Promise<T>): Promise<T>;
  /** Awaits a call to another callee (a tool call): one that answers makes `park`'s next wait the shortest again. */
  awaitingTool<T>(call: Promise<T>): Promise<T>;
  /**
   * A callee refused (`admission_closed`): park at the latest boundary until resume, then retry from
   * it. After a delivered call with no boundary since, wait a short while as a blocker instead (also
   * while admission is closed: the checkpoint waits for the session's next boundary), then retry.
   * The short wait is 100 ms, doubled per refusal in a row up to 2 s, each jittered to between half and
   * all of it (`ParkBackoff`); an answered
   * call (`awaitingModel`, `awaitingTool`) or a boundary starts it over.
   */
  park(): Promise<void>;
}

interface Session {
  key: string;
  episode: EpisodeId;
  state: SessionState;
  snapshot: (() => Boundary) | null;
  /** A restored continuation no activation has claimed yet. */
  restored: Boundary | null | undefined;
  freshBoundary: boolean;
  /** A policy call made at the latest boundary got its response: that boundary is stale until the next one. */
  delivered: boolean;
  /** An activation ended with `delivered` set: continuing from the snapshot would repeat that call. */
  stale: boolean;
  /** A retire started (it may have been cut short by its deadline): a blocker, never exported, until a retire drops it. */
  retiring: boolean;
  /**
   * Its state is being freed (or a free failed) outside a retire: a restored session the last
   * commit left out, or one the environment closed. Held (never served, claimed or exported; its
   * key refused) until a free ends, so no new session opens over state about to be freed.
   */
  freeing: "left_out" | "closed" | undefined;
  /** The free of its state now running (`freeHeld`): one at a time, and a loop waiting on it looks again after. */
  inFree: Promise<void> | undefined;
  activation: { abort: AbortController; done: Promise<void> } | undefined;
}

/** A session held while its state is freed is served to nobody; the rollout may start over once it is gone. */
function refuseFreeing(s: Session, episode: EpisodeId): void {
  if (s.freeing === "left_out") {
    throw new CheckpointError("admission_closed", `session ${s.key}'s restored state is being freed (the last commit left it out); retry`);
  }
  if (s.freeing !== "closed") return;
  // The closed attempt itself is over for good; any other opens the key once the free ended (it
  // was told stale_attempt means dispatch anew, so refusing it stale_attempt too would strand it).
  if (sameEpisode(s.episode, episode)) throw new CheckpointError("stale_attempt", `session ${s.key} (${captureKey(s.episode)}) was closed`);
  throw new CheckpointError("admission_closed", `session ${s.key} (${captureKey(s.episode)}) was closed and its state is still being freed; retry`);
}

/**
 * A retiring session (its retire still stops or frees it, or a retire cut short left it a blocker)
 * is served to nobody. Its own attempt and older ones are over; a newer attempt of its rollout is
 * what the controller dispatched after the retire, told so by stale_attempt: it opens the key once
 * the retire dropped the session, so it is asked to retry, not to dispatch yet another attempt.
 */
function refuseRetiring(s: Session, episode: EpisodeId): void {
  if (!s.retiring) return;
  if (episode.rollout_id === s.episode.rollout_id && episode.attempt > s.episode.attempt) {
    throw new CheckpointError("admission_closed", `session ${s.key} (${captureKey(s.episode)}) is still being retired; retry`);
  }
  throw new CheckpointError("stale_attempt", `session ${s.key} (${captureKey(s.episode)}) is being retired`);
}

export interface ActivateOptions {
  /**
   * Checks a restored continuation (throws a catalog refusal, e.g. `invalid_checkpoint_state`)
   * before the activation claims it, so one the turn loop cannot continue from is refused with the
   * session still restored (as `BeginOptions.checkBoundary` keeps a legacy `/run` record).
   */
  checkBoundary?: (boundary: Boundary) => void;
}

/** A session a free loop holds on to: the loop frees this very session, never one opened on its key since. */
export type HeldSession = Readonly<Pick<Session, "key" | "episode">>;

/** Which held sessions a loop frees: a commit's clean-up or a close (`freeing`), a retire (`retiring`), a forget (either). */
export type HeldFor = "freeing" | "retiring" | "held";

export interface ExportedSession {
  key: string;
  episode: EpisodeId;
  boundary: Boundary | null;
  restored: boolean;
}

export class AgentSessions {
  readonly gate: AdmissionGate;
  private readonly sessions = new Map<string, Session>();

  constructor(
    private readonly isRetired: (episode: EpisodeId) => boolean,
    private readonly onChange: () => void = () => undefined,
    private readonly clock: Clock = systemClock,
  ) {
    // The clock runs the park retry (and draws its jitter), so fake-clock tests control it.
    this.gate = new AdmissionGate(clock);
  }

  get size(): number {
    return this.sessions.size;
  }

  get restoredPending(): number {
    return [...this.sessions.values()].filter((s) => s.restored !== undefined).length;
  }

  states(): Record<SessionState, number> {
    const counts: Record<SessionState, number> = { idle: 0, running: 0, at_boundary: 0 };
    for (const s of this.sessions.values()) counts[s.state] += 1;
    return counts;
  }

  has(key: string): boolean {
    return this.sessions.has(key);
  }

  stateOf(key: string): SessionState | undefined {
    return this.sessions.get(key)?.state;
  }

  /** Sessions between boundaries block a prepare, and so does one being retired, whatever its state (protocol §9). */
  blockers(): string[] {
    return [...this.sessions.values()].filter((s) => s.retiring || s.state === "running").map((s) => captureKey(s.episode));
  }

  /** Idle sessions whose snapshot is stale: the controller restarts them from input. */
  restarts(): string[] {
    return [...this.sessions.values()].filter((s) => s.stale && !s.retiring && !s.freeing && s.state === "idle").map((s) => captureKey(s.episode));
  }

  close(): void {
    this.gate.close();
    this.onChange();
  }

  open(): void {
    this.gate.open();
    // Activations that ended stale while admission was closed stop blocking: restarts from now on.
    for (const s of this.sessions.values()) if (s.stale && !s.activation && s.state === "running") s.state = "idle";
    this.onChange();
  }

  /**
   * Opens (or re-binds) a session. The same key with another attempt → `stale_attempt`; the same
   * (next-attempt) id re-binds a restored session. New sessions are refused while admission is closed.
   */
  openSession(episode: EpisodeId, key: string): { restored: boolean } {
    // A key its record cannot hold would fail every commit while the session lives.
    if (!AgentRecordSchema.shape.session_key.safeParse(key).success) {
      throw new CheckpointError("invalid_request", `session key ${JSON.stringify(key.slice(0, 64))} is not 1-200 characters of [A-Za-z0-9._-] starting with a letter or digit`);
    }
    if (this.isRetired(episode)) throw new CheckpointError("stale_attempt", fencedAttempt(captureKey(episode)));
    const existing = this.sessions.get(key);
    if (existing) {
      refuseRetiring(existing, episode);
      refuseFreeing(existing, episode);
      if (!sameEpisode(existing.episode, episode)) {
        throw new CheckpointError("stale_attempt", `session ${key} belongs to ${captureKey(existing.episode)}, not ${captureKey(episode)}`);
      }
      return { restored: existing.restored !== undefined };
    }
    if (this.gate.closed) throw new CheckpointError("admission_closed", "a checkpoint is open; no new sessions until resume");
    this.placeIdle(key, episode, { restored: undefined, retiring: false });
    this.onChange();
    return { restored: false };
  }

  /** Runs one activation of an open, idle session of the same attempt; every check runs before anything changes. */
  activate<T>(episode: EpisodeId, key: string, fn: (activation: Activation) => Promise<T>, options: ActivateOptions = {}): Promise<T> {
    const s = this.requireSession(episode, key);
    if (s.state !== "idle") throw new CheckpointError("invalid_request", `session ${key} is already running an activation`);
    if (s.restored && options.checkBoundary) options.checkBoundary(s.restored);
    const abort = new AbortController();
    let finished!: () => void;
    const current = { abort, done: new Promise<void>((resolve) => (finished = resolve)) };
    s.activation = current;
    // A call the turn loop gave up on may settle after its activation ended: it changes nothing then.
    const live = () => s.activation === current;
    const requireLive = () => {
      abort.signal.throwIfAborted();
      if (!live()) throw new CheckpointError("invalid_request", `session ${key}: this activation has ended`);
    };
    let continuation = s.restored ?? null;
    if (s.restored !== undefined) {
      // Claimed: until a new boundary is reported, the restored one is still where it continues from.
      const restoredBoundary = s.restored;
      s.snapshot = restoredBoundary === null ? null : () => restoredBoundary;
      s.restored = undefined;
    }
    this.setState(s, "running");
    const setState = (state: SessionState) => {
      if (live()) this.setState(s, state);
    };
    // Per activation: a new one's first refused call waits the shortest time again.
    const backoff = new ParkBackoff(this.clock);
    const waitParked = async () => {
      setState("at_boundary");
      try {
        await this.gate.waitOpen(abort.signal);
      } finally {
        if (!abort.signal.aborted) setState("running");
      }
    };
    // A call its callee answered: a later refusal is retried after the shortest wait again.
    const answered = async <T>(call: Promise<T>): Promise<T> => {
      const result = await call;
      backoff.reset();
      return result;
    };
    const activation: Activation = {
      episode: s.episode,
      sessionKey: key,
      signal: abort.signal,
      continuation: () => {
        const c = continuation;
        continuation = null;
        // A copy: the restored snapshot is still what a checkpoint exports until the next boundary.
        return c && copyBoundary(c);
      },
      boundary: async (snapshot) => {
        requireLive();
        s.snapshot = snapshot;
        s.freshBoundary = true;
        s.delivered = false;
        s.stale = false;
        backoff.reset();
        if (this.gate.closed) await waitParked();
      },
      awaitingModel: async (call) => {
        if (!s.freshBoundary) return answered(call);
        setState("at_boundary");
        try {
          const result = await answered(call);
          // The model counts this call as delivered and exports it, so the boundary before it is
          // stale. A response arriving while admission is closed had started before the model closed
          // (held ones arrive only after resume). As after an environment's finished wait step, the
          // session blocks and runs on to its next boundary (callees close after this stage) and
          // parks there; if prepare already passed, the commit refuses (protocol §3.5: readiness
          // regressed, `invalid_phase`) rather than export the stale boundary.
          if (live()) s.delivered = true;
          return result;
        } finally {
          if (live()) s.freshBoundary = false;
          if (!abort.signal.aborted) setState("running");
        }
      },
      awaitingTool: answered,
      park: async () => {
        requireLive();
        // Not at a boundary after a delivered call: wait as a blocker rather than export the stale one.
        const blocking = s.delivered || s.stale;
        setState(blocking ? "running" : "at_boundary");
        try {
          if (blocking) {
            // A checkpoint's prepare waits for this session to reach its next boundary, so it never
            // waits for our own admission to reopen (that waits for the prepare, which waits for it):
            // the refused call (a tool call after the delivered policy call) is retried after a short
            // wait, as while our admission is open, and the session runs on to its next boundary.
            await this.gate.nextChange(abort.signal, backoff.next());
            return;
          }
          if (!this.gate.closed) await this.gate.nextChange(abort.signal, backoff.next());
          await this.gate.waitOpen(abort.signal);
          // The retried call is made from the same boundary, so it again counts as at the boundary.
          if (live()) s.freshBoundary = !s.delivered;
        } finally {
          if (!abort.signal.aborted) setState("running");
        }
      },
    };
    const run = async () => {
      // A checkpoint is open: the idle session was exported at its boundary (its snapshot, or the
      // restored continuation), and a turn loop started now is between boundaries until its first
      // one (a commit would refuse, readiness regressed). It waits there for resume, as an
      // environment step does not start while a checkpoint is open; a close or retire stops it.
      if (this.gate.closed) await waitParked();
      return fn(activation);
    };
    return run().finally(() => {
      // The snapshot stays: an idle session is exported at its activation's final boundary, so a
      // caller that has not received the result yet continues from it instead of starting over.
      s.activation = undefined;
      s.freshBoundary = false;
      if (s.delivered) s.stale = true;
      s.delivered = false;
      // A stale session becomes a restart, but not while a checkpoint is open (its restart set is
      // fixed at prepare): until resume it blocks instead. One held for freeing is neither: idle.
      if (this.sessions.get(key) === s) this.setState(s, s.stale && this.gate.closed && !s.freeing ? "running" : "idle");
      finished();
      this.onChange();
    });
  }

  /**
   * The environment ended the episode: hold the session (never reopened or served), then cancel
   * any activation still running. Returns it for the caller to free (`freeHeld`, which skips it
   * if a retire took it over).
   */
  async closeSession(episode: EpisodeId, key: string): Promise<HeldSession | undefined> {
    const s = this.sessions.get(key);
    if (!s) return undefined;
    if (!sameEpisode(s.episode, episode)) {
      throw new CheckpointError("stale_attempt", `session ${key} belongs to ${captureKey(s.episode)}, not ${captureKey(episode)}`);
    }
    if (!s.retiring && s.freeing !== "closed") {
      s.freeing = "closed";
      s.restored = undefined;
      this.onChange();
    }
    await this.stop(s, "closed");
    // One whose activation had already ended stale while a checkpoint is open blocks ("running"):
    // held for its free now, it is idle, as one whose activation ends after the close.
    if (s.freeing === "closed" && !s.retiring && !s.activation) this.setState(s, "idle");
    return s;
  }

  /** Sessions exported by a checkpoint: parked ones at their latest snapshot, restored ones at their continuation. */
  exportable(scope: EpisodeId[] | null): ExportedSession[] {
    const wanted = scope ? new Set(scope.map(captureKey)) : undefined;
    return [...this.sessions.values()]
      .filter((s) => s.state !== "running" && !s.stale && !s.retiring && !s.freeing && !this.isRetired(s.episode) && (!wanted || wanted.has(captureKey(s.episode))))
      .map((s) => ({
        key: s.key,
        episode: s.episode,
        boundary: s.restored !== undefined ? s.restored : (s.snapshot?.() ?? null),
        restored: s.restored !== undefined,
      }));
  }

  /** Installs restored sessions bound to their NEXT attempt (the caller validated everything). */
  installRestored(items: { key: string; episode: EpisodeId; boundary: Boundary | null }[]): void {
    for (const item of items) this.placeIdle(item.key, item.episode, { restored: item.boundary, retiring: false });
    this.onChange();
  }

  /**
   * Sessions a failed restore's hook may still hold and could not free: retiring (blockers, never
   * exported or claimed) until a retire of their attempt drops them and frees them again.
   */
  holdRetiring(items: { key: string; episode: EpisodeId }[]): void {
    for (const item of items) this.placeIdle(item.key, item.episode, { restored: undefined, retiring: true });
    this.onChange();
  }

  /** An idle session nobody has claimed: a new one, or placed by a restore (restored, or held retiring). */
  private placeIdle(key: string, episode: EpisodeId, fields: { restored: Boundary | null | undefined; retiring: boolean }): void {
    this.sessions.set(key, { key, episode, state: "idle", snapshot: null, freshBoundary: false, delivered: false, stale: false, freeing: undefined, inFree: undefined, activation: undefined, ...fields });
  }

  /** Holds the restored sessions not yet claimed whose episode is outside `scope` while the commit's clean-up frees them: no longer restored, never claimed. */
  leaveOutUnclaimed(scope: EpisodeId[] | null): void {
    if (!scope) return;
    const wanted = new Set(scope.map(captureKey));
    const left = [...this.sessions.values()].filter((s) => s.restored !== undefined && s.state === "idle" && !wanted.has(captureKey(s.episode)));
    for (const s of left) {
      s.restored = undefined;
      s.freeing = "left_out";
    }
    if (left.length) this.onChange();
  }

  /** Sessions held for freeing (left out by a commit, or closed), but those a retire took over or a close still stops. */
  heldForFreeing(): HeldSession[] {
    return [...this.sessions.values()].filter((s) => this.isHeld(s, "freeing"));
  }

  /**
   * The held sessions of these rollouts (retiring, or held for freeing), but those whose activation
   * still runs: a retire that overran its deadline is still waiting for it, and frees it after.
   */
  heldOf(rolloutIds: string[]): HeldSession[] {
    const forgotten = new Set(rolloutIds);
    return [...this.sessions.values()].filter((s) => this.isHeld(s, "held") && forgotten.has(s.episode.rollout_id));
  }

  /**
   * Resolves once every retiring session of these rollouts has no activation running: a retire cut
   * short by its deadline is still waiting for it, and a forget must not lift its fence before.
   */
  async retiredActivationsEnded(rolloutIds: string[]): Promise<void> {
    const forgotten = new Set(rolloutIds);
    const running = [...this.sessions.values()].filter((s) => s.retiring && forgotten.has(s.episode.rollout_id) && s.activation);
    await Promise.all(running.map((s) => s.activation!.done));
  }

  /**
   * Frees a held session's state with `free`, then drops it. A free loop may outlive the lock (a
   * commit's clean-up, a retire past its deadline), so this looks again first: only while its key
   * still names this very session and it is still held (not freed and dropped by another loop, the
   * key then reopened by the next attempt). One free per session at a time: a loop that finds one
   * running waits for it, then looks again. False when there was nothing left to free; a free that
   * throws leaves the session held, for a later loop.
   */
  async freeHeld(held: HeldSession, heldFor: HeldFor, free: (key: string) => Promise<void>): Promise<boolean> {
    const s = held as Session;
    // Bounded: each turn waits for one free to end, and a session is freed at most until it is dropped.
    while (s.inFree) await s.inFree;
    if (this.sessions.get(s.key) !== s || !this.isHeld(s, heldFor)) return false;
    const freeing = free(s.key);
    s.inFree = freeing.then(
      () => undefined,
      () => undefined,
    );
    try {
      await freeing;
    } finally {
      s.inFree = undefined;
    }
    if (this.sessions.get(s.key) === s) {
      this.sessions.delete(s.key);
      this.onChange();
    }
    return true;
  }

  private isHeld(s: Session, heldFor: HeldFor): boolean {
    // A running activation may still use the state: its close or retire frees it once it ended.
    if (s.activation) return false;
    if (heldFor === "retiring") return s.retiring;
    if (heldFor === "freeing") return s.freeing !== undefined && !s.retiring;
    return s.retiring || s.freeing !== undefined;
  }

  /**
   * Retire: every session of these rollouts with attempt ≤ N is marked retiring, cancelled and
   * waited for. Returns them; the caller frees each (`freeHeld`), so one whose free fails stays
   * retiring (a blocker, never reopened) for a retried retire.
   */
  async retire(episodes: EpisodeId[]): Promise<HeldSession[]> {
    const covers = retiredBy(episodes);
    const targets = [...this.sessions.values()].filter((s) => covers(s.episode));
    // Marked before the wait: a retire cut short by its deadline leaves them blockers, not exportable.
    for (const s of targets) s.retiring = true;
    if (targets.length) this.onChange();
    await Promise.all(targets.map((s) => this.stop(s, "retired")));
    return targets;
  }

  private async stop(s: Session, why: "closed" | "retired"): Promise<void> {
    const activation = s.activation;
    if (!activation) return;
    activation.abort.abort(new CheckpointError("stale_attempt", `session ${s.key} (${captureKey(s.episode)}) was ${why}`));
    await activation.done;
  }

  private requireSession(episode: EpisodeId, key: string): Session {
    if (this.isRetired(episode)) throw new CheckpointError("stale_attempt", fencedAttempt(captureKey(episode)));
    const s = this.sessions.get(key);
    if (!s) throw new CheckpointError("invalid_request", `no open session ${key}; call open_session first`);
    // Held by a failed restore (or a retire cut short, whose attempt is fenced anyway): never served.
    refuseRetiring(s, episode);
    refuseFreeing(s, episode);
    if (!sameEpisode(s.episode, episode)) {
      throw new CheckpointError("stale_attempt", `session ${key} belongs to ${captureKey(s.episode)}, not ${captureKey(episode)}`);
    }
    return s;
  }

  private setState(s: Session, state: SessionState): void {
    if (s.state === state) return;
    s.state = state;
    this.onChange();
  }
}
