import type { Logger } from "pino";
import {
  CheckpointError,
  MAX_TIMER_MS,
  captureKey,
  nextAttempt,
  sameEpisode,
  type EpisodeId,
} from "../../../protocol/index.js";
import type { KindReadiness, ParticipantContext, ParticipantKind } from "../../control-plane/participant-kind.js";
import { AdmissionGate } from "./admission-gate.js";
import type { JsonValue } from "./json-value.js";
import type { CheckpointMode, CheckpointVerify } from "./resources-modes.js";
import type { ResourcesSessionHooks } from "./resources-session-hooks.js";
import { ResourcesSessionRecordSchema, SessionOwnerSchema, type ResourcesSessionRecord } from "./resources-session-record.js";
import { fencedAttempt, retiredBy } from "../../control-plane/attempt-marks.js";
import { currentAttemptsOnly, refuseTwoAttempts } from "../../control-plane/one-attempt-per-rollout.js";
import { systemClock, type Clock } from "../../control-plane/clock.js";
import { UnusedSessionTimers } from "./unused-session-timers.js";

/**
 * How long a session a replayable `/verify` ended outside a checkpoint is kept by default: the
 * coordinator's default op deadline, the longest a checkpoint's prepare normally spends between
 * the environment's stage and this one.
 */
export const REPLAYABLE_END_HOLD_MS = 60_000;

/**
 * How long a seeded session no request has named since lives by default: far longer than an
 * agent takes from a seed's reply to its first call, so only a session whose seed reply was lost
 * (nobody can name it) ends by it.
 */
export const UNUSED_SEED_LIFETIME_MS = 3_600_000;

/** Why `owner` cannot be written into records (the record schema would refuse every one), if it cannot. */
export function ownerRefusal(owner: string | null): string | undefined {
  if (owner !== null && !SessionOwnerSchema.safeParse(owner).success) return "owner (the routing id written into records) must be 1-200 characters";
  return undefined;
}

/** How a request relates to the session lifecycle. */
export type RequestRole = "seed" | "verify" | "close" | "other";

export interface ResourcesKindOptions {
  mode: CheckpointMode;
  verify: CheckpointVerify;
  /** Required in `exported` mode; in other modes only `retireSessionState` is used, to free. */
  hooks?: Partial<ResourcesSessionHooks>;
  /** Routing owner written into records (the worker id); null for a single-worker server. */
  owner?: string | null;
  logger?: Logger;
  /**
   * How long a session a replayable `/verify` ended while no checkpoint was open here stays held
   * (default REPLAYABLE_END_HOLD_MS; 0 ends it at once). A checkpoint whose prepare reaches this
   * server meanwhile exports it and ends it at its resume: the environment, prepared first, may
   * hold that episode before its verify (the step was still running there), and the verify it
   * replays after a restore needs the session.
   */
  replayableEndHoldMs?: number;
  /**
   * How long a session a seed (or `sessions.started`) bound lives while no other request names it
   * (default UNUSED_SEED_LIFETIME_MS; 0: for ever). It then ends as a close would end it (in
   * `exported` mode its state is freed); one passing while a checkpoint is open here ends it at
   * that checkpoint's resume.
   */
  unusedSeedLifetimeMs?: number;
  clock?: Clock;
}

interface Session {
  sessionId: string;
  episode: EpisodeId;
  /** Restored and not yet claimed by a request of its (next) attempt. */
  restored: boolean;
  owner: string | null;
}

/** One admitted data-plane request; released when its response is finished or aborted. */
export interface RequestTicket {
  readonly episode: EpisodeId;
  readonly sessionId: string | undefined;
  readonly role: RequestRole;
  /** Counted in flight (holds up prepare). */
  readonly counted: boolean;
  /**
   * Aborted (reason: a `stale_attempt` CheckpointError) when a retire covers the request's attempt
   * or session: the retire waits for the request, so a handler that waits on something that may
   * never come (a cohort) must stop on it.
   */
  readonly signal: AbortSignal;
}

interface ActiveRequest extends RequestTicket {
  released: boolean;
  readonly stop: AbortController;
}

/**
 * The resources participant kind: a session table learned from the requests, the admission gate,
 * in-flight counting, export per commit scope, all-or-nothing install, and stop-then-free retire.
 */
export class ResourcesKind implements ParticipantKind<ResourcesSessionRecord> {
  readonly kind = "resources" as const;
  readonly recordSchema = ResourcesSessionRecordSchema;
  readonly mode: CheckpointMode;
  readonly verify: CheckpointVerify;
  private readonly hooks: Partial<ResourcesSessionHooks>;
  private readonly owner: string | null;
  private readonly logger: Logger | undefined;
  private readonly gate = new AdmissionGate();
  private readonly sessions = new Map<string, Session>();
  private readonly active = new Set<ActiveRequest>();
  /** Sessions being retired: blockers until their retire finished. */
  private readonly retiring = new Map<string, EpisodeId>();
  /** Retired session ids per rollout, refused with `stale_attempt` until forget. */
  private readonly retiredSessions = new Map<string, Set<string>>();
  /** The same marks by session id (a cookie may come back under any prefix). */
  private readonly retiredSessionRollout = new Map<string, string>();
  private readonly releaseWaiters = new Set<() => void>();
  /** Frees of sessions a retired attempt's handler built but may not bind; retire waits for them. */
  private readonly freeing = new Set<Promise<void>>();
  /**
   * Frees of finished sessions' states (exported mode), by the episode each session was bound to:
   * live state until done, so a restore naming one of those ids does not install a state the free
   * then deletes, and a retire of that attempt replies only once it ended.
   */
  private readonly freeingFinished = new Map<Promise<void>, EpisodeId>();
  /**
   * The session ids those frees (and a retired handler's, `freeing`) are freeing, with how many run
   * for each: a reset (`sessions.started`) carrying one of them takes a fresh id, or the running free
   * would delete the state it builds.
   */
  private readonly freeingIds = new Map<string, number>();
  /**
   * Restored sessions afterCommit dropped and is freeing, and finished sessions whose free failed:
   * a request naming one is refused (`admission_closed`) until its free ended, so none is served
   * from state about to be freed.
   */
  private readonly freeingRestored = new Set<string>();
  /**
   * Of those, the ones whose free failed (a finished session's too): still refused and live state, and freed again by the next
   * commit's clean-up, a retire of their attempt or a forget of their rollout (dropped untracked, their state would leak and
   * a request naming them would be served from it).
   */
  private readonly heldAfterFailedFree = new Map<string, EpisodeId>();
  /**
   * The free of each session's state under way (retireSessionState), by session id: a second free of
   * one runs only once the first ended, never beside it (see freeState).
   */
  private readonly stateFrees = new Map<string, Promise<void>>();
  /** After-commit frees of restored sessions under way (they may outlive the commit and the resume), with their episodes. */
  private readonly leftOutFrees = new Set<{ episodes: EpisodeId[]; done: Promise<void> }>();
  /**
   * Sessions a replayable `/verify` ended while a checkpoint was open: ended at reopen. Until then
   * they stay in the checkpoint, which holds their episode at its boundary before that verify, so
   * the verify a restored episode replays finds its session (and an exported server its state).
   */
  private readonly endAtReopen = new Map<string, EpisodeId>();
  /**
   * Sessions a replayable `/verify` ended while admission was open, held for `replayableEndHoldMs`:
   * a prepare meanwhile moves them to `endAtReopen`, otherwise their timer ends them.
   */
  private readonly heldAfterEnd = new Map<string, { episode: EpisodeId; cancel: () => void }>();
  private readonly replayableEndHoldMs: number;
  private readonly clock: Clock;
  /** Seeded sessions no request has named since, ended when their lifetime passes unused. */
  private readonly unused: UnusedSessionTimers;
  /** Of those, the ones whose lifetime passed while a checkpoint was open: ended at reopen. */
  private readonly expireAtReopen = new Map<string, Session>();
  /** The app closed (dispose): no hold's timer fires into the server any more. */
  private disposed = false;
  /** Session ids the current commit exported: a stop commit parks these and no others. */
  private exported: string[] = [];
  private context: ParticipantContext | undefined;

  constructor(options: ResourcesKindOptions) {
    this.mode = options.mode;
    this.verify = options.verify;
    this.hooks = options.hooks ?? {};
    this.owner = options.owner ?? null;
    // Written into every record: one the record schema refuses would fail every commit with sessions.
    const badOwner = ownerRefusal(this.owner);
    if (badOwner) throw new Error(badOwner);
    this.logger = options.logger;
    this.replayableEndHoldMs = options.replayableEndHoldMs ?? REPLAYABLE_END_HOLD_MS;
    if (!(this.replayableEndHoldMs >= 0 && this.replayableEndHoldMs <= MAX_TIMER_MS)) throw new Error(`replayableEndHoldMs must be a number of milliseconds from 0 to ${MAX_TIMER_MS}`);
    this.clock = options.clock ?? systemClock;
    const lifetime = options.unusedSeedLifetimeMs ?? UNUSED_SEED_LIFETIME_MS;
    if (!(lifetime >= 0 && lifetime <= MAX_TIMER_MS)) throw new Error(`unusedSeedLifetimeMs must be a number of milliseconds from 0 to ${MAX_TIMER_MS}`);
    this.unused = new UnusedSessionTimers(this.clock, lifetime);
    if (this.mode === "exported") {
      for (const hook of ["exportSessionStates", "restoreSessionStates", "retireSessionState"] as const) {
        if (typeof this.hooks[hook] !== "function") throw new Error(`checkpointMode "exported" requires the ${hook} hook`);
      }
    }
  }

  attach(context: ParticipantContext): void {
    this.context = context;
  }

  // ---- data plane ------------------------------------------------------------------------

  /** True when this request may be replayed after a crash, so it neither waits nor counts. */
  isReplayable(role: RequestRole): boolean {
    return role === "verify" && this.verify === "replay";
  }

  /** True while a free of this session id's state runs (its session ended or was never bound). */
  isFreeing(sessionId: string): boolean {
    return this.freeingIds.has(sessionId);
  }

  /** The episode a session is bound to (live or restored), if it is known here. */
  sessionEpisode(sessionId: string): EpisodeId | undefined {
    return this.sessions.get(sessionId)?.episode;
  }

  /**
   * Admits one request: waits for resume when it must, then applies the fences, then counts it.
   * Throws a catalog error (and changes nothing) when the request is refused.
   */
  async admit(request: { episode: EpisodeId; sessionId: string | undefined; role: RequestRole }, signal?: AbortSignal): Promise<RequestTicket> {
    const replayable = this.isReplayable(request.role);
    // restart_only servers keep serving during a checkpoint; only seeds wait, so the restart set
    // cannot change. Every other server parks non-replayable requests until resume.
    const waits = this.mode === "restart_only" ? request.role === "seed" : !replayable;
    // Used, even before it waits for resume: its session must still be there when it runs.
    if (request.sessionId !== undefined && request.role !== "seed") this.markUsed(request.sessionId, request.episode);
    if (waits) await this.gate.waitOpen(signal);

    this.refuseRetired(request);
    this.refuseFreeing(request);
    if (request.role !== "close") {
      if (request.sessionId !== undefined && request.role !== "seed") {
        const session = this.sessions.get(request.sessionId);
        if (session && !sameEpisode(session.episode, request.episode)) {
          throw new CheckpointError("stale_attempt", `the session is bound to ${captureKey(session.episode)}, not ${captureKey(request.episode)}`);
        }
        // The replacement attempt's first request claims its restored session.
        if (session?.restored) session.restored = false;
      }
    }
    // restart_only never holds up prepare, except a seed already in flight: its session must
    // show up in `restarts` before the checkpoint's restart set is read.
    const counted = this.mode === "restart_only" ? request.role === "seed" : !replayable;
    const stop = new AbortController();
    const ticket: ActiveRequest = { ...request, counted, released: false, stop, signal: stop.signal };
    this.active.add(ticket);
    if (counted) this.context?.notifyReadinessChanged();
    return ticket;
  }

  /**
   * Its handler is about to run. A retire that came after admission waits for the request, so the
   * request is refused here (changing nothing) rather than writing state for a freed session.
   */
  enter(ticket: RequestTicket): void {
    this.refuseRetired(ticket);
  }

  /**
   * A request that is no seed starts a session (`sessions.started`). On restart_only servers it
   * neither waited nor counts, so while admission is closed it is refused: the restart set must
   * not change during a checkpoint.
   */
  checkStart(ticket: RequestTicket): void {
    if (this.mode === "restart_only" && ticket.role !== "seed" && !this.gate.isOpen) {
      throw new CheckpointError("admission_closed", "a checkpoint is open; a restart_only server starts no session until resume");
    }
  }

  /** Called while the request still counts in flight, after a 2xx response was produced. */
  succeeded(ticket: RequestTicket): void {
    if (ticket.sessionId === undefined) return;
    if (ticket.role === "seed") this.bind(ticket.sessionId, ticket.episode);
    else if (ticket.role === "verify" || ticket.role === "close") this.endServed(ticket, ticket.sessionId);
  }

  /**
   * The request ended its session (a 2xx `/verify`, `/close_session` or `sessions.ended`). A
   * replayable request served while admission is closed ends it only at reopen: the checkpoint
   * being taken holds its episode before that request, which a restore sends again. Served while
   * admission is open, it is held a while (`replayableEndHoldMs`) for the same reason: a checkpoint
   * may have prepared the environment already, before the verify's reply reached it.
   */
  endServed(ticket: RequestTicket, sessionId: string): void {
    if (this.isReplayable(ticket.role) && this.mode !== "restart_only" && this.sessions.has(sessionId)) {
      if (!this.gate.isOpen) return void this.endAtReopen.set(sessionId, ticket.episode);
      if (this.replayableEndHoldMs > 0 && !this.disposed) return this.holdAfterEnd(sessionId, ticket.episode);
    }
    this.endFinished(sessionId, ticket.episode);
  }

  private holdAfterEnd(sessionId: string, episode: EpisodeId): void {
    this.dropPendingEnd(sessionId); // a second verify holds it anew
    const cancel = this.clock.setTimer(() => {
      // A seed that took the session up again is still running: its success starts it again (and
      // drops this end), so ending it now would free the state that seed is building. Held anew;
      // a seed that fails leaves it to end then.
      if (!this.disposed && [...this.active].some((r) => r.role === "seed" && r.sessionId === sessionId)) return this.holdAfterEnd(sessionId, episode);
      this.endFinished(sessionId, episode);
    }, this.replayableEndHoldMs);
    this.heldAfterEnd.set(sessionId, { episode, cancel });
  }

  /**
   * Ends a finished session and, in `exported` mode, frees its state: a handler whose request is
   * replayable must not free it (the checkpoint being taken may still export it), so nothing else
   * would, and it would be held for good.
   */
  private endFinished(sessionId: string, episode: EpisodeId): void {
    // Ended for good now (a close after a replayable verify, its hold's timer, a reopen): no later end.
    this.dropPendingEnd(sessionId);
    const held = this.sessions.has(sessionId);
    this.end(sessionId, episode);
    if (!(this.mode === "exported" && held && !this.sessions.has(sessionId))) return;
    const free = (async () => {
      try {
        await this.freeState(sessionId);
      } catch (error) {
        // Nothing names an ended session any more, so nothing would free it again: held like a
        // left-out restored session whose free failed (its id refused, live state), and freed again
        // by the next commit's clean-up, a retire of its attempt or a forget of its rollout.
        this.logger?.warn({ episode: captureKey(episode), err: error }, "freeing the state of a finished session failed; held until a later commit, a retire or a forget frees it");
        this.holdAfterFailedFree(sessionId, episode);
      }
    })();
    this.freeingFinished.set(free, episode);
    this.trackFreeing(sessionId, free);
    void free.finally(() => this.freeingFinished.delete(free));
  }

  /**
   * Explicit lifecycle for protocols no route reveals (Gymnasium reset / terminal step). A retired
   * attempt's request that got into its handler before the retire binds nothing: whatever its
   * handler built is freed (the retire waits for that) and the request gets `stale_attempt`.
   */
  bind(sessionId: string, episode: EpisodeId): void {
    if (this.context?.isRetired(episode)) {
      // Only a session nobody holds is this handler's to free: a bound one is the retire's (it frees
      // it) or another attempt's (not ours to touch).
      if (!this.sessions.has(sessionId)) this.freeUnbound(sessionId, episode);
      throw new CheckpointError("stale_attempt", `${captureKey(episode)} was retired`);
    }
    const existing = this.sessions.get(sessionId);
    if (existing && sameEpisode(existing.episode, episode)) {
      existing.restored = false;
      // Started again (a seed or `sessions.started` carrying the cookie of a session its verify
      // ended): live now, so the end still pending for the old run (its hold) must not end it.
      this.dropPendingEnd(sessionId);
      this.armUnused(existing);
      return;
    }
    if (existing) throw new CheckpointError("stale_attempt", `the session is bound to ${captureKey(existing.episode)}`);
    const session: Session = { sessionId, episode, restored: false, owner: this.owner };
    this.sessions.set(sessionId, session);
    this.armUnused(session);
  }

  /** Starts the lifetime of a session just seeded: its reply may never reach the agent. */
  private armUnused(session: Session): void {
    if (!this.disposed) this.unused.arm(session.sessionId, () => this.expireUnused(session));
  }

  /** A request of the session's episode names it: the agent got its seed reply. */
  private markUsed(sessionId: string, episode: EpisodeId): void {
    const session = this.sessions.get(sessionId);
    if (!session || !sameEpisode(session.episode, episode)) return;
    this.unused.cancel(sessionId);
    this.expireAtReopen.delete(sessionId);
  }

  /**
   * The lifetime of a seeded session passed with no request naming it: ended and freed like a
   * closed one (endFinished, whose free a newer session under that id is kept from). Only that
   * binding: one since ended, retired or replaced is left alone. While a checkpoint is open it is
   * in that checkpoint: ended at reopen instead.
   */
  private expireUnused(session: Session, atReopen = false): void {
    const { sessionId, episode } = session;
    if (this.disposed || this.sessions.get(sessionId) !== session || this.retiring.has(sessionId)) return;
    // A request of it still running (a re-seed, a reset's handler): not unused, started anew.
    if ([...this.active].some((r) => r.sessionId === sessionId)) return this.armUnused(session);
    if (!atReopen && !this.gate.isOpen) return void this.expireAtReopen.set(sessionId, session);
    this.logger?.info({ episode: captureKey(episode) }, "a seeded session no request named within its lifetime ended (its seed reply was likely lost)");
    this.endFinished(sessionId, episode);
  }

  /**
   * Ends a session; a late request of another attempt cannot end the current attempt's session.
   * What it left scheduled goes with it (its lifetime timer, armed by the seed or reset that bound
   * it, would otherwise stay for up to the lifetime, an hour by default, doing nothing).
   */
  end(sessionId: string, episode: EpisodeId): void {
    const existing = this.sessions.get(sessionId);
    if (!(existing && sameEpisode(existing.episode, episode) && !this.retiring.has(sessionId))) return;
    this.sessions.delete(sessionId);
    this.dropPendingEnd(sessionId);
  }

  release(ticket: RequestTicket): void {
    const active = ticket as ActiveRequest;
    if (active.released) return;
    active.released = true;
    this.active.delete(active);
    if (active.counted) this.context?.notifyReadinessChanged();
    for (const wake of [...this.releaseWaiters]) wake();
  }

  /**
   * The server shut down (its app closed): the holds' timers are cancelled, so none fires into it
   * later (its `retireSessionState` on a server that released what it frees with, or a timer
   * keeping the kind and the server reachable for up to the hold); a verify still finishing ends
   * its session at once. The held sessions go with the process, as live ones do.
   */
  dispose(): void {
    this.disposed = true;
    for (const { cancel } of this.heldAfterEnd.values()) cancel();
    this.heldAfterEnd.clear();
    this.unused.cancelAll();
    this.expireAtReopen.clear();
  }

  // ---- ParticipantKind -------------------------------------------------------------------

  readiness(): KindReadiness {
    const blockers = new Set<string>();
    let inflight = 0;
    for (const request of this.active) {
      if (!request.counted) continue;
      inflight += 1;
      blockers.add(captureKey(request.episode));
    }
    for (const episode of this.retiring.values()) blockers.add(captureKey(episode));
    const restarts = this.mode === "restart_only" ? [...new Set([...this.sessions.values()].map((s) => captureKey(s.episode)))].sort() : [];
    return {
      blockers: [...blockers].sort(),
      counts: { inflight, sessions: this.sessions.size, restored: this.restoredCount(), waiting: this.gate.waiting },
      restarts,
    };
  }

  async closeAdmission(): Promise<void> {
    this.gate.close();
    // The sessions recent replayable verifies ended go into this checkpoint and end at its reopen.
    for (const [sessionId, { episode, cancel }] of this.heldAfterEnd) {
      cancel();
      this.endAtReopen.set(sessionId, episode);
    }
    this.heldAfterEnd.clear();
  }

  async openAdmission(): Promise<void> {
    for (const [sessionId, episode] of this.endAtReopen) this.endFinished(sessionId, episode);
    this.endAtReopen.clear();
    // Requests that waited for this reopen took theirs out of this list (markUsed).
    const expired = [...this.expireAtReopen.values()];
    this.expireAtReopen.clear();
    for (const session of expired) this.expireUnused(session, true);
    this.gate.reopen();
  }

  async exportRecords(scope: EpisodeId[] | null): Promise<ResourcesSessionRecord[]> {
    this.exported = [];
    if (this.mode === "restart_only") return [];
    const wanted = scope ? new Set(scope.map(captureKey)) : undefined;
    // One attempt per rollout (the highest): a session of an earlier attempt nobody retired here
    // would put the rollout in the checkpoint twice.
    const candidates = currentAttemptsOnly(
      [...this.sessions.values()].filter(
        (s) =>
          !this.retiring.has(s.sessionId) &&
          !this.context?.isRetired(s.episode) &&
          (wanted === undefined || wanted.has(captureKey(s.episode))),
      ),
      (s) => s.episode,
    );
    if (this.mode === "stateless") {
      return candidates.map((s) => ({ episode_id: s.episode, session_id: s.sessionId, state: null, owner: s.owner }));
    }
    const states = candidates.length ? await this.hooks.exportSessionStates!(candidates.map((s) => s.sessionId)) : {};
    const records: ResourcesSessionRecord[] = [];
    for (const s of candidates) {
      if (!Object.hasOwn(states, s.sessionId)) {
        // The server already dropped it (e.g. a verifier that cleaned up after failing).
        this.logger?.warn({ episode: captureKey(s.episode) }, "session no longer held by the server; not exported");
        continue;
      }
      records.push({ episode_id: s.episode, session_id: s.sessionId, state: states[s.sessionId] as JsonValue, owner: s.owner });
    }
    this.exported = records.map((r) => r.session_id);
    return records;
  }

  hasLiveState(): boolean {
    return this.sessions.size > 0 || this.active.size > 0 || this.freeingRestored.size > 0 || this.freeingFinished.size > 0;
  }

  async install(records: ResourcesSessionRecord[]): Promise<void> {
    if (this.hasLiveState()) throw new CheckpointError("invalid_checkpoint_state", "restore needs a server without sessions or requests");
    if (records.length === 0) return;
    if (this.mode === "restart_only") {
      throw new CheckpointError("invalid_checkpoint_state", "a restart_only resources server keeps nothing in a checkpoint; its records cannot be restored");
    }
    // Sessions are keyed by id, so two of one rollout at two attempts would both be installed.
    refuseTwoAttempts(records);
    const seen = new Set<string>();
    for (const record of records) {
      if (seen.has(record.session_id)) throw new CheckpointError("invalid_checkpoint_state", "a session id appears twice in the records");
      seen.add(record.session_id);
      const next = nextAttempt(record.episode_id);
      if (this.context?.isRetired(next)) throw new CheckpointError("stale_attempt", `${captureKey(next)} is retired`);
      if (this.mode === "stateless" && record.state !== null) {
        throw new CheckpointError("invalid_checkpoint_state", "a stateless server's records must carry state null");
      }
    }
    if (this.mode === "exported") {
      // Own properties, whatever the id: assigning `states["__proto__"]` would set the prototype.
      const states: Record<string, JsonValue> = Object.fromEntries(records.map((record) => [record.session_id, record.state as JsonValue]));
      try {
        await this.hooks.restoreSessionStates!(states);
      } catch (error) {
        const why = `restoring session states failed: ${error instanceof Error ? error.message : String(error)}`;
        // The hook promises all or nothing, but one that failed part way may hold some states no
        // session tracks, which neither this refusal nor a retire would free: free them all now.
        const kept = await this.freeFailedRestore(records);
        if (kept.length === 0) throw new CheckpointError("invalid_checkpoint_state", why, { cause: error });
        // Not a refusal that changed nothing: the coordinator's clean-up retires attempt+1 here.
        throw new CheckpointError(
          "internal_error",
          `${why}; freeing ${kept.length} of its session states failed too (${kept[0]}): they are held as their next attempt, refused and blocking, until a retire of it frees them`,
          { cause: error },
        );
      }
    }
    // Cookies keep working: the client holds the same session cookie under the next attempt.
    for (const record of records) {
      this.sessions.set(record.session_id, { sessionId: record.session_id, episode: nextAttempt(record.episode_id), restored: true, owner: record.owner });
    }
  }

  /**
   * After a restoreSessionStates that threw: frees every state it was handed (retireSessionState
   * tolerates one that is not there). A state whose free fails is held as a session of its next
   * attempt that is retiring (a blocker, refused with `stale_attempt`), exactly as a retire cut
   * short leaves one, so the clean-up's retire of attempt+1 (or forget) frees it again. Returns
   * those frees' failures.
   */
  private async freeFailedRestore(records: ResourcesSessionRecord[]): Promise<string[]> {
    const failures: string[] = [];
    for (const record of records) {
      try {
        await this.freeState(record.session_id);
      } catch (error) {
        const episode = nextAttempt(record.episode_id);
        failures.push(`${captureKey(episode)}: ${error instanceof Error ? error.message : String(error)}`);
        this.sessions.set(record.session_id, { sessionId: record.session_id, episode, restored: false, owner: record.owner });
        this.retiring.set(record.session_id, episode);
        this.markRetiredSession(record.session_id, episode.rollout_id);
      }
    }
    if (failures.length) this.context?.notifyReadinessChanged();
    return failures;
  }

  async retire(episodes: EpisodeId[]): Promise<void> {
    const covers = retiredBy(episodes);
    const targets = new Map<string, Session>();
    // A seed of a covered attempt already inside its handler binds its session only once it
    // succeeds, after the sessions were listed: list again after every wait until none is new.
    for (let round = 0; ; round++) {
      const fresh = [...this.sessions.values()].filter((s) => covers(s.episode) && !targets.has(s.sessionId));
      if (round > 0 && fresh.length === 0) break;
      for (const s of fresh) {
        targets.set(s.sessionId, s);
        this.retiring.set(s.sessionId, s.episode);
        this.markRetiredSession(s.sessionId, s.episode.rollout_id);
      }
      this.context?.notifyReadinessChanged();
      // Stop: wait for every request of those sessions or attempts, replayable ones included. Each
      // is told to stop (its signal), so one that waits on others (a cohort member) ends its wait.
      const stopped = (r: ActiveRequest) => covers(r.episode) || (r.sessionId !== undefined && targets.has(r.sessionId));
      for (const r of this.active) {
        if (r.role !== "close" && stopped(r)) r.stop.abort(new CheckpointError("stale_attempt", `${captureKey(r.episode)} was retired while its request ran`));
      }
      await this.waitUntil(() => ![...this.active].some(stopped));
    }
    await Promise.all([...this.freeing]);
    // Restored sessions of these attempts an after-commit clean-up is freeing: the reply waits for
    // those frees, and frees here one that failed (held), so a retire never replies over their state.
    await Promise.all([...this.leftOutFrees].filter((f) => f.episodes.some(covers)).map((f) => f.done));
    // So do the frees of its attempts' finished sessions (a close or verify just before the retire):
    // one that failed is held by then and freed below.
    await Promise.all([...this.freeingFinished].filter(([, episode]) => covers(episode)).map(([done]) => done));
    for (const [sessionId, episode] of [...this.heldAfterFailedFree]) {
      if (!covers(episode)) continue;
      this.heldAfterFailedFree.delete(sessionId); // taken: a clean-up running meanwhile does not free it too
      await this.freeLeftOut(sessionId, episode);
    }
    // Free, then drop. A failing hook leaves the session retiring (a blocker) so the retire can be retried.
    for (const s of targets.values()) {
      await this.freeState(s.sessionId);
      this.sessions.delete(s.sessionId);
      this.retiring.delete(s.sessionId);
      this.dropPendingEnd(s.sessionId);
    }
    this.context?.notifyReadinessChanged();
  }

  async forget(rolloutIds: string[]): Promise<void> {
    // A retire whose free failed left its sessions retiring (blockers): nothing may lift their
    // fence while they hold state, and no later retire would list them again, so forget frees them
    // first, and fails (the fence kept) while a free does.
    const forgotten = new Set(rolloutIds);
    // A retire cut short by its deadline may still wait for requests it stopped (a handler slow to
    // stop): freed and unfenced now, what such a request writes afterwards would outlive the free
    // until that retire ended. Waited for as retire does (the control plane bounds this by the
    // forget's deadline; past it nothing is freed and no fence lifted).
    const retiringIds = new Set([...this.retiring].filter(([, episode]) => forgotten.has(episode.rollout_id)).map(([sessionId]) => sessionId));
    const stoppedByRetire = (r: ActiveRequest) =>
      forgotten.has(r.episode.rollout_id) && (r.stop.signal.aborted || (r.sessionId !== undefined && retiringIds.has(r.sessionId)));
    await this.waitUntil(() => ![...this.active].some(stoppedByRetire));
    for (const [sessionId, episode] of this.retiring) {
      if (!forgotten.has(episode.rollout_id)) continue;
      await this.freeState(sessionId);
      this.sessions.delete(sessionId);
      this.retiring.delete(sessionId);
      this.dropPendingEnd(sessionId);
      this.context?.notifyReadinessChanged();
    }
    for (const [sessionId, episode] of [...this.heldAfterFailedFree]) {
      if (!forgotten.has(episode.rollout_id)) continue;
      this.heldAfterFailedFree.delete(sessionId); // taken: a clean-up running meanwhile does not free it too
      await this.freeLeftOut(sessionId, episode);
      this.context?.notifyReadinessChanged();
    }
    for (const rollout of rolloutIds) {
      for (const id of this.retiredSessions.get(rollout) ?? []) this.retiredSessionRollout.delete(id);
      this.retiredSessions.delete(rollout);
    }
  }

  async afterCommit(scope: EpisodeId[] | null, options: { stop: boolean }): Promise<void> {
    // This commit's exports, taken before the frees below: they may outlive the commit and the
    // resume, and the next commit's export would replace them.
    const exported = this.exported;
    this.exported = [];
    const freeing: { sessionId: string; episode: EpisodeId }[] = [];
    if (scope !== null) {
      // Restored sessions whose replacement never started and that the controller no longer
      // continues are freed; no fence, since the rollout may still run as that attempt. All dropped
      // before the first hook's await (this hook may outlive the commit and the resume): none can be
      // claimed and then freed meanwhile, and a request naming one is refused until its free ended.
      const wanted = new Set(scope.map(captureKey));
      for (const s of [...this.sessions.values()].filter((s) => s.restored && !wanted.has(captureKey(s.episode)))) {
        this.sessions.delete(s.sessionId);
        this.freeingRestored.add(s.sessionId);
        freeing.push(s);
      }
    }
    // Those an earlier clean-up failed to free are tried again (taken, so no other free runs beside).
    for (const [sessionId, episode] of this.heldAfterFailedFree) freeing.push({ sessionId, episode });
    this.heldAfterFailedFree.clear();
    const frees = (async () => {
      for (const s of freeing) {
        try {
          await this.freeLeftOut(s.sessionId, s.episode);
        } catch (error) {
          this.logger?.warn({ episode: captureKey(s.episode), err: error }, "freeing a restored session the commit left out failed; held until a later commit, a retire or a forget frees it");
        }
      }
    })();
    const tracked = { episodes: freeing.map((s) => s.episode), done: frees };
    this.leftOutFrees.add(tracked);
    try {
      await frees;
    } finally {
      this.leftOutFrees.delete(tracked);
    }
    // Only the exported sessions are parked (protocol §9 `park_exported`): the others (outside the
    // scope, retiring, dropped by the server) are not in the checkpoint, so their compute is not
    // kept for a restore.
    if (options.stop && this.mode === "exported" && this.hooks.parkSessionStates) {
      const ids = exported.filter((id) => this.sessions.has(id));
      if (ids.length) await this.hooks.parkSessionStates(ids);
    }
  }

  statusExtras(): Record<string, unknown> {
    const retired = this.retiredSessionRollout.size;
    return {
      mode: this.mode,
      verify: this.verify,
      retired_sessions: retired,
      accepting: this.gate.isOpen,
      sessions: this.sessions.size,
      restored: this.restoredCount(),
      inflight: [...this.active].filter((r) => r.counted).length,
    };
  }

  // ---- helpers ---------------------------------------------------------------------------

  /** The retirement fences; `/close_session` passes (a caller closes a session only once). */
  private refuseRetired(request: { episode: EpisodeId; sessionId: string | undefined; role: RequestRole }): void {
    if (request.role === "close") return;
    if (this.context?.isRetired(request.episode)) throw new CheckpointError("stale_attempt", fencedAttempt(captureKey(request.episode)));
    if (request.sessionId !== undefined && request.role !== "seed" && this.retiredSessionRollout.has(request.sessionId)) {
      throw new CheckpointError("stale_attempt", `session of ${request.episode.rollout_id} was retired`);
    }
  }

  /**
   * A restored session afterCommit is freeing is served to nobody. A seed arriving now gets a new
   * session (its cookie names no known session), but one that kept the cookie's session before it
   * waited for resume would bind it and build state the running free then deletes: refused too.
   */
  private refuseFreeing(request: { sessionId: string | undefined; role: RequestRole }): void {
    if (request.role === "close" || request.sessionId === undefined) return;
    if (this.freeingRestored.has(request.sessionId)) {
      throw new CheckpointError("admission_closed", "the session's state is being freed (a restored session the last commit left out, or a finished one whose free failed); retry, or seed a new session");
    }
  }

  /**
   * Frees a session's state through the server's hook, one free of a session at a time. A retire cut
   * short by its deadline leaves its free running (the control plane frees the lock), and its retry,
   * a forget or a clean-up would otherwise free the same state again beside it: a sandbox deleted
   * twice at once, the second delete failing and failing that retry. A later free waits for the one
   * under way, then runs (the hook tolerates a state already gone), so it still frees whatever is
   * there by then.
   */
  private freeState(sessionId: string): Promise<void> {
    const before = this.stateFrees.get(sessionId);
    // Started now when nothing runs for this id (as a direct hook call would be), else once that free settled.
    const run = async () => {
      await this.hooks.retireSessionState?.(sessionId);
    };
    const free = before ? before.then(run) : run();
    const settled = free.then(
      () => undefined,
      () => undefined,
    );
    this.stateFrees.set(sessionId, settled);
    void settled.then(() => {
      if (this.stateFrees.get(sessionId) === settled) this.stateFrees.delete(sessionId);
    });
    return free;
  }

  private trackFreeing(sessionId: string, free: Promise<void>): void {
    this.freeingIds.set(sessionId, (this.freeingIds.get(sessionId) ?? 0) + 1);
    void free.finally(() => {
      const left = (this.freeingIds.get(sessionId) ?? 1) - 1;
      if (left > 0) this.freeingIds.set(sessionId, left);
      else this.freeingIds.delete(sessionId);
    });
  }

  /**
   * Frees a session a retired attempt's handler may have built. One whose free fails is held (its
   * id refused, live state) for the retire waiting on it to free again, as a failed free of a
   * restored session the commit left out is: logged only, the retire replied over its state.
   */
  private freeUnbound(sessionId: string, episode: EpisodeId): void {
    const free = (async () => {
      try {
        await this.freeState(sessionId);
      } catch (error) {
        this.logger?.warn({ err: error }, "freeing the session of a retired attempt failed; its retire frees it again");
        this.holdAfterFailedFree(sessionId, episode);
      }
    })();
    this.freeing.add(free);
    this.trackFreeing(sessionId, free);
    void free.finally(() => this.freeing.delete(free));
  }

  /** A session whose free failed: refused and live state until the next commit's clean-up, a retire of its attempt or a forget of its rollout frees it. */
  private holdAfterFailedFree(sessionId: string, episode: EpisodeId): void {
    this.freeingRestored.add(sessionId);
    this.heldAfterFailedFree.set(sessionId, episode);
  }

  /**
   * Frees a restored session a commit left out (taken from the held ones by its caller). A free that
   * fails holds it again, refused and live state, for the next commit's clean-up or a forget of its
   * rollout, and throws.
   */
  private async freeLeftOut(sessionId: string, episode: EpisodeId): Promise<void> {
    try {
      await this.freeState(sessionId);
    } catch (error) {
      this.holdAfterFailedFree(sessionId, episode);
      throw error;
    }
    this.freeingRestored.delete(sessionId);
  }

  /**
   * A session dropped without ending (retired), or started again, takes its pending end along: a
   * hold's timer, or the end at reopen a prepare (or a restore's close) moved it to, would otherwise
   * end whatever session later carries that id as that episode (the same session restored again
   * after a forget, or seeded again).
   */
  private dropPendingEnd(sessionId: string): void {
    this.heldAfterEnd.get(sessionId)?.cancel();
    this.heldAfterEnd.delete(sessionId);
    this.endAtReopen.delete(sessionId);
    this.unused.cancel(sessionId);
    this.expireAtReopen.delete(sessionId);
  }

  /** Refuses the session's requests (`stale_attempt`) until its rollout is forgotten. */
  private markRetiredSession(sessionId: string, rolloutId: string): void {
    let ids = this.retiredSessions.get(rolloutId);
    if (!ids) this.retiredSessions.set(rolloutId, (ids = new Set()));
    ids.add(sessionId);
    this.retiredSessionRollout.set(sessionId, rolloutId);
  }

  private restoredCount(): number {
    let n = 0;
    for (const s of this.sessions.values()) if (s.restored) n += 1;
    return n;
  }

  private async waitUntil(done: () => boolean): Promise<void> {
    while (!done()) {
      await new Promise<void>((resolve) => {
        const wake = () => {
          this.releaseWaiters.delete(wake);
          resolve();
        };
        this.releaseWaiters.add(wake);
      });
    }
  }
}
