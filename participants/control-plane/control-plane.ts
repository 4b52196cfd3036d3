import { trace, type Context, type Span } from "@opentelemetry/api";
import type { Stats } from "node:fs";
import { lstat, readdir, realpath, stat } from "node:fs/promises";
import { isAbsolute, join, normalize } from "node:path";
import type { Logger } from "pino";
import {
  CheckpointError,
  GUARDED_OPS,
  IncarnationSchema,
  InstanceSchema,
  MANIFEST_FILE,
  MANIFEST_SCHEMA_VERSION,
  MAX_BLOCKERS,
  MAX_DEADLINE_AHEAD_S,
  PARTICIPANTS_DIR,
  PROTOCOL_VERSION,
  MAX_CONTROL_MESSAGE_BYTES,
  captureKey,
  isUnreadableStorage,
  namesCheckpoint,
  nextAttempt,
  parseName,
  restoreScopeIssue,
  toCheckpointError,
  type CommitReply,
  type CommitRequest,
  type EpisodeId,
  type ForgetReply,
  type ForgetRequest,
  type Phase,
  type PhaseOp,
  type PrepareReply,
  type PrepareReport,
  type PrepareRequest,
  type RecordBase,
  type RenewReply,
  type RenewRequest,
  type ReplyOf,
  type RequestOf,
  type RestoreReply,
  type RestoreRequest,
  type ResumeReply,
  type ResumeRequest,
  type RetireReply,
  type RetireRequest,
  type StatusReply,
  type StatusRequest,
} from "../../protocol/index.js";
import type { CheckpointStorage, ParticipantTarget } from "../storage/checkpoint-storage.js";
import { FsCheckpointStorage, participantDir } from "../storage/fs-storage.js";
import { WriteGate } from "../storage/write-gate.js";
import { ATTR, countRefusal, observeParticipant, participantInstruments, withSpan } from "../telemetry/instruments.js";
import { AsyncLock } from "./async-lock.js";
import { fitCommitReply } from "./commit-reply.js";
import { AttemptMarks } from "./attempt-marks.js";
import { setTimerAt, systemClock, type Clock } from "./clock.js";
import { ClockSkewWatch, DEADLINE_PASSED, DEADLINE_TOO_FAR, explainSkew } from "./clock-skew.js";
import { HeldInstallFailure, heldStateFailure } from "./held-install-failure.js";
import { newIncarnation } from "./incarnation.js";
import type { ParticipantKind } from "./participant-kind.js";
import { ResumedFence } from "./resumed-fence.js";

export interface ControlPlaneOptions<R extends RecordBase> {
  adapter: ParticipantKind<R>;
  instance: string;
  /** This process's incarnation, as announced in the membership registry (default: a fresh one). */
  incarnation?: string;
  storage?: CheckpointStorage;
  clock?: Clock;
  /** Lease = max(current, deadline + grace); a participant whose lease expires resumes by itself. */
  leaseGraceSeconds?: number;
  /** When set, every checkpoint_dir must lie inside this directory. */
  checkpointRoot?: string;
  logger?: Logger;
  /** Upper bound between readiness re-checks while a prepare waits (notifications usually come first). */
  readinessPollMs?: number;
  /**
   * The epoch fence to start from (default 0): startParticipant reads it from the leader lease, so
   * a restarted process refuses a deposed leader's delayed op as its predecessor would have.
   */
  epochFloor?: number;
  /**
   * Whether the leader lease has issued `epoch`, asked before an epoch above any seen or confirmed
   * here raises the fence (startParticipant reads the lease: see leaseIssued). Undefined: every
   * epoch is taken as issued.
   */
  epochIssued?: (epoch: number) => Promise<boolean>;
}

/** One export per checkpoint: a retry with the same directory and scope reuses it. */
interface PendingWrite<R> {
  checkpointId: string;
  dir: string;
  scopeKey: string;
  stop: boolean;
  createdAt: number;
  records: R[] | undefined;
  /**
   * The adapter's manifest extra, asked once with the records: a retry after a write that published
   * the manifest and then failed must write the same manifest, or it is refused as another one.
   */
  extra: Record<string, unknown> | undefined;
  gate: WriteGate;
  running: Promise<CommitReply> | undefined;
  /**
   * The lease without the renewals of the commits awaiting this write (other renewals meanwhile
   * raise it): put back if the write fails, since a failed commit extends nothing. Undefined while
   * no such renewal stands.
   */
  leaseBefore: number | null | undefined;
}

const GUARDED: ReadonlySet<PhaseOp> = new Set<PhaseOp>(GUARDED_OPS);

const ALLOWED: Record<"prepare" | "commit" | "restore" | "renew", readonly Phase[]> = {
  prepare: ["idle", "preparing"],
  commit: ["prepared"],
  restore: ["idle"],
  renew: ["preparing", "prepared", "committed", "restored"],
};

/**
 * The kind-agnostic participant control plane: phase machine, fences, lease, reply cache,
 * export-once commit and all-or-nothing restore. One lock serializes transitions; the readiness
 * wait of prepare, the storage write of commit and the kind's after-commit hook run outside it so
 * a resume (or lease expiry) can always abort or end them.
 *
 *   idle --prepare--> preparing --(ready)--> prepared --commit--> committed
 *   idle --restore--> restored
 *   any non-idle --resume | lease expiry--> idle
 */
/** How soon a lease expiry whose reopen failed is tried again. */
const LEASE_RETRY_MS = 1000;
/** How long freeing a late restore install (the kind's retire, under the lock) may take before it is tried again later. */
const LATE_FREE_MS = 30_000;

export class ParticipantControlPlane<R extends RecordBase = RecordBase> {
  readonly adapter: ParticipantKind<R>;
  readonly instance: string;
  readonly incarnation: string;
  private readonly storage: CheckpointStorage;
  private readonly clock: Clock;
  private readonly graceSeconds: number;
  private readonly checkpointRoot: string | undefined;
  private readonly logger: Logger | undefined;
  private readonly pollMs: number;
  private readonly skew: ClockSkewWatch;

  private readonly lock = new AsyncLock();
  private readonly resumed = new ResumedFence(64);
  private readonly retired = new AttemptMarks("was retired");
  /** Source attempts of the restore installed here: each continues as its next attempt only. */
  private readonly restoredFrom = new AttemptMarks("was restored here as a later attempt");
  /** Replies per (id, op), with the arguments they answered (a retry must ask the same) and a restore's manifest pin. */
  private readonly cache = new Map<string, CachedReply>();
  /**
   * Commit replies of the last few checkpoints resumed after they committed. The coordinator
   * resumes while it publishes, so a successor that finds the decision but no checkpoint.json
   * re-drives the commit to participants that already resumed: they answer it from here (the
   * records are durable) instead of refusing it, and the publication completes.
   */
  private readonly resumedCommits = new Map<string, CachedReply>();
  private phase: Phase = "idle";
  private activeId: string | null = null;
  private leaseExpiresAt: number | null = null;
  private cancelLeaseTimer: (() => void) | undefined;
  private highestEpoch = 0;
  /** The highest epoch the leader lease was found to have issued (see isIssued); never lowers the fence. */
  private confirmedEpoch = 0;
  private readonly epochIssued: ((epoch: number) => Promise<boolean>) | undefined;
  private pendingWrite: PendingWrite<R> | undefined;
  private pendingInstall: Promise<unknown> | undefined;
  /**
   * An install that outlived its restore's deadline and has not ended (see abandonLateInstall): no
   * restore runs beside it, and a forget of one of the rollouts whose next attempt it may still
   * install waits for it (see forget).
   */
  private lateInstall: { freed: Promise<void>; rollouts: ReadonlySet<string> } | undefined;
  /** A closeAdmission that outlived its op's deadline and has not ended (see abandonLateClose): no close or open runs beside it. */
  private lateClose: Promise<void> | undefined;
  /** A failed install that left state held: the same restore sent again is refused the same way. */
  private readonly heldInstallFailure = new HeldInstallFailure();
  private closedAt: number | undefined;
  /** Aborted once the process stops serving: a prepare waiting for readiness answers at once, not prepared; a retire or forget is cut short. */
  private readonly stopSignal = new AbortController();
  private disposed = false;
  /** Cancels of the armed retries (a failed reopen's, a late install's free): dispose cancels them all. */
  private readonly retryTimers = new Set<() => void>();
  private readonly waiters = new Set<() => void>();
  /** A wake of the waiters is queued for the end of this event-loop turn (see notify). */
  private wakeScheduled = false;
  private readonly unobserve: () => void;

  constructor(options: ControlPlaneOptions<R>) {
    this.adapter = options.adapter;
    // A subject token of its control subjects and a directory name (`gym/<kind>/<instance>`).
    this.instance = parseName(InstanceSchema, options.instance, "a participant's instance");
    this.incarnation = IncarnationSchema.parse(options.incarnation ?? newIncarnation());
    this.storage = options.storage ?? new FsCheckpointStorage();
    this.clock = options.clock ?? systemClock;
    this.graceSeconds = options.leaseGraceSeconds ?? 600;
    // Finite: an infinite lease never expires, and a renew could not say when it does.
    if (!(this.graceSeconds > 0 && Number.isFinite(this.graceSeconds))) throw new CheckpointError("invalid_request", "leaseGraceSeconds must be a finite number > 0");
    // Absolute, as the coordinator's: checkpoint_dir arrives absolute, so a relative root would
    // accept the process and then refuse every commit.
    if (options.checkpointRoot !== undefined && !isAbsolute(options.checkpointRoot)) {
      throw new CheckpointError("invalid_request", `checkpointRoot ${JSON.stringify(options.checkpointRoot)} must be an absolute path`);
    }
    // Normalized (`//`, `/./`, a trailing slash), as the paths checked against it are.
    this.checkpointRoot = options.checkpointRoot === undefined ? undefined : normalize(options.checkpointRoot).replace(/\/+$/, "");
    // Only what the parent lacks: pino writes a key bound twice twice (a server's logger has `instance`).
    const bound = options.logger?.bindings() ?? {};
    this.logger = options.logger?.child({ kind: this.adapter.kind, ...(bound["instance"] === this.instance ? {} : { instance: this.instance }) });
    this.pollMs = options.readinessPollMs ?? 1000;
    this.skew = new ClockSkewWatch(this.clock, this.logger);
    this.highestEpoch = options.epochFloor ?? 0;
    this.confirmedEpoch = this.highestEpoch;
    this.epochIssued = options.epochIssued;
    this.adapter.attach?.({
      notifyReadinessChanged: () => this.notify(),
      isRetired: (episode) => this.isRetired(episode),
    });
    this.unobserve = observeParticipant({
      kind: this.adapter.kind,
      instance: this.instance,
      observe: () => {
        const readiness = this.adapter.readiness();
        const offsetMs = this.skew.lastOffsetMs;
        return { counts: readiness.counts, blockers: readiness.blockers.length, ...(offsetMs !== undefined && { clockOffsetS: offsetMs / 1000 }) };
      },
    });
  }

  /** The clock durations are measured on: monotonic when the clock has one, so a wall-clock step skews no metric. */
  private elapsedNow(): number {
    return this.clock.monotonic ? this.clock.monotonic() : this.clock.now();
  }

  get currentPhase(): Phase {
    return this.phase;
  }

  get activeCheckpointId(): string | null {
    return this.activeId;
  }

  /**
   * For data-plane admission: a retired attempt, or one a restore here continued as a later
   * attempt, is refused with `stale_attempt` until forget.
   */
  assertNotRetired(episode: EpisodeId): void {
    for (const marks of [this.retired, this.restoredFrom]) {
      if (marks.has(episode)) throw new CheckpointError("stale_attempt", marks.describe(episode));
    }
  }

  /** True for a retired attempt and for one a restore here continued as a later attempt (until forget). */
  isRetired(episode: EpisodeId): boolean {
    return this.retired.has(episode) || this.restoredFrom.has(episode);
  }

  /**
   * Dispatches one validated request; the incarnation and epoch fences come before anything else.
   * `sentAtMs`: the coordinator's clock when it sent the op (Gym-Sent-At), when it said: this
   * clock's offset from it is logged and explains a deadline refused as already passed.
   */
  async handle<O extends PhaseOp | "status">(op: O, request: RequestOf<O>, parent?: Context, sentAtMs?: number): Promise<ReplyOf<O>> {
    const offsetMs = sentAtMs === undefined ? undefined : this.skew.observe(sentAtMs, { op, epoch: (request as { epoch?: number }).epoch });
    if (op === "status") {
      // A probe's epoch the lease never issued is not refused (status is read-only), only not raised to.
      const epoch = (request as StatusRequest).epoch;
      return this.status(epoch !== undefined && (await this.isIssued(epoch)) ? epoch : undefined) as ReplyOf<O>;
    }
    const phaseRequest = request as RequestOf<PhaseOp>;
    // A retire or forget outside any checkpoint carries a placeholder id: left out, as the coordinator's span does.
    const checkpointId = namesCheckpoint(op, phaseRequest.checkpoint_id) ? phaseRequest.checkpoint_id : undefined;
    const attributes = {
      ...(checkpointId !== undefined && { [ATTR.checkpointId]: checkpointId }),
      [ATTR.epoch]: phaseRequest.epoch,
      [ATTR.kind]: this.adapter.kind,
      [ATTR.instance]: this.instance,
    };
    const started = this.elapsedNow(); // durations: a wall-clock step must not skew them
    const instruments = participantInstruments();
    const reply = await withSpan(`checkpoint.${op}`, attributes, parent, async (span) => {
      try {
        this.checkIncarnation(op as PhaseOp, phaseRequest);
        this.checkEpoch(phaseRequest.epoch); // early refusal; each op checks again, and raises it, under the lock
        await this.checkIssued(phaseRequest.epoch);
        const result = await this.dispatch(op as PhaseOp, phaseRequest);
        spanResult(span, op, result);
        instruments.opDuration.record((this.elapsedNow() - started) / 1000, { op, kind: this.adapter.kind, outcome: "ok" });
        return result;
      } catch (thrown) {
        const error = explainSkew(thrown, offsetMs);
        const code = toCheckpointError(error).code; // what the endpoint answers: storage_error for a full disk
        instruments.opDuration.record((this.elapsedNow() - started) / 1000, { op, kind: this.adapter.kind, outcome: "error" });
        countRefusal(error, this.adapter.kind);
        // Inside the op's span, so the line carries its trace_id / span_id.
        this.logger?.warn({ op, ...(checkpointId !== undefined && { checkpoint_id: checkpointId }), code, err: error }, "control operation refused");
        throw error;
      }
    });
    return reply as ReplyOf<O>;
  }

  private dispatch(op: PhaseOp, request: RequestOf<PhaseOp>): Promise<unknown> {
    switch (op) {
      case "prepare":
        return this.prepare(request as PrepareRequest);
      case "renew":
        return this.renew(request as RenewRequest);
      case "commit":
        return this.commit(request as CommitRequest);
      case "restore":
        return this.restore(request as RestoreRequest);
      case "resume":
        return this.resume(request as ResumeRequest);
      case "retire":
        return this.retire(request as RetireRequest);
      case "forget":
        return this.forget(request as ForgetRequest);
      default: {
        const unreachable: never = op;
        throw new CheckpointError("invalid_request", `unknown op ${String(unreachable)}`);
      }
    }
  }

  /**
   * Read-only, except that an `epoch` above the highest seen raises it: a new leader's recovery
   * probe carries its epoch, so no deposed leader's delayed op is admitted here once that leader
   * serves (ops already queued on the lock re-check it there). A lower one is not refused, only
   * not raised: status stays answerable to anyone with the token.
   */
  status(epoch?: number): StatusReply {
    if (epoch !== undefined && epoch > this.highestEpoch) this.highestEpoch = epoch;
    const report = this.report();
    return {
      kind: this.adapter.kind,
      instance: this.instance,
      phase: this.phase,
      checkpoint_id: this.activeId,
      lease_expires_at: this.leaseExpiresAt,
      epoch: this.highestEpoch,
      retired_rollouts: this.retired.size,
      // Status serves operators and recovery (phase, checkpoint): its restarts are a sample like the
      // blockers, with the full count in `counts.restarts`, so the reply fits one NATS message at
      // any scale (a restart-only resources server lists every live session). Prepare lists them all.
      report: { ...report, restarts: report.restarts.slice(0, MAX_BLOCKERS), counts: { ...report.counts, restarts: report.restarts.length } },
      protocol_version: PROTOCOL_VERSION,
      extras: this.adapter.statusExtras?.() ?? {},
    };
  }

  // ---- prepare ---------------------------------------------------------------------------

  private async prepare(request: PrepareRequest): Promise<PrepareReply> {
    this.checkDeadline(request.deadline_ts);
    const id = request.checkpoint_id;
    const early = await this.underLock(request, async () => {
      const cached = this.cached<PrepareReply>(id, "prepare");
      if (cached) {
        // Every prepare renews, a retry answered from its kept reply too (a controller polling
        // prepare sends the stages already prepared a new deadline): else a short grace lets the
        // lease expire under that prepare, resuming this participant and fencing the id. Kept
        // replies live only while the id is active (a resume drops them).
        if (this.activeId === id) this.renewLease(request.deadline_ts);
        return cached;
      }
      this.admit(id, ALLOWED.prepare, "prepare");
      if (this.phase === "idle") {
        this.activeId = id;
        this.phase = "preparing";
        this.renewLease(request.deadline_ts);
        this.closedAt = this.elapsedNow();
        let closed: boolean;
        try {
          closed = await this.closeWithinDeadline(id, request.deadline_ts, "prepare");
        } catch (error) {
          // Phase and admission must never disagree: reopen everything.
          await this.reopen(undefined);
          throw error;
        }
        if (!closed) {
          // A refusal changes nothing: idle again, holding no id or lease. Admission reopens once the
          // kind's close ends (abandonLateClose), not beside it.
          this.phase = "idle";
          this.activeId = null;
          this.leaseExpiresAt = null;
          this.cancelLeaseTimer?.();
          this.cancelLeaseTimer = undefined;
          this.closedAt = undefined;
          throw lateCloseRefusal("prepare");
        }
      } else {
        this.renewLease(request.deadline_ts);
      }
      return undefined;
    });
    if (early) return early;

    try {
      await withSpan("wait_ready", { [ATTR.kind]: this.adapter.kind, [ATTR.instance]: this.instance }, undefined, async (span) => {
        // Recorded at every check, so a wait that throws still shows what blocked it.
        await this.waitReady(id, request.deadline_ts, (blockerCount) => span.setAttribute(ATTR.blockers, blockerCount));
        span.setAttribute(ATTR.blockers, this.report().blocker_count);
      });
    } catch (error) {
      // Only a prepare still waiting is undone: a retry of it that got there first may have made
      // it prepared (its reply cached and maybe sent), which this failure must not reopen under.
      await this.lock.run(() => (this.activeId === id && this.phase === "preparing" ? this.reopen(undefined) : undefined));
      throw error;
    }

    return this.lock.run(() => {
      const report = this.report();
      if (this.activeId !== id) return { phase: this.phase === "idle" ? "idle" : "preparing", report } as PrepareReply;
      // A stopping process never becomes prepared: it could not commit, so the coordinator must abort.
      if (this.phase === "preparing" && report.ready && !this.stopping) {
        this.phase = "prepared";
        const reply: PrepareReply = { phase: "prepared", report };
        this.remember(id, "prepare", reply);
        return reply;
      }
      // Prepared by a retry of it meanwhile, or committed since (a retry still waiting on its poll
      // timer): the reply it was prepared with, as a retry arriving now gets, never `preparing`.
      if (this.phase === "prepared" || this.phase === "committed") return this.cached<PrepareReply>(id, "prepare") ?? { phase: "prepared", report };
      participantInstruments().blockersAtDeadline.record(report.blocker_count, { kind: this.adapter.kind });
      this.logger?.info({ checkpoint_id: id, blockers: report.blockers, blocker_count: report.blocker_count, stopping: this.stopping }, "prepare_not_ready");
      return { phase: "preparing", report } satisfies PrepareReply;
    });
  }

  /** Waits outside the lock; wakes on readiness notifications and on stopping, re-checks at least every pollMs. */
  private async waitReady(id: string, deadlineTs: number, checked: (blockerCount: number) => void): Promise<void> {
    for (;;) {
      if (this.stopping || this.activeId !== id || this.phase !== "preparing") return;
      const report = this.report();
      checked(report.blocker_count);
      if (report.ready) return;
      const remaining = deadlineTs * 1000 - this.clock.now();
      if (remaining <= 0) return;
      await new Promise<void>((resolve) => {
        const wake = () => {
          cancel();
          this.waiters.delete(wake);
          resolve();
        };
        const cancel = this.clock.setTimer(wake, Math.min(this.pollMs, remaining));
        this.waiters.add(wake);
      });
    }
  }

  /**
   * Wakes the waiting prepare once per event-loop turn, however many notifications the turn brought.
   * A drain notifies once per episode that parks, each from its own I/O callback, and a readiness
   * check (O(episodes) in every kind) per notification would make a prepare of 10,000 episodes spend
   * seconds of event loop checking; under load one turn carries many parks, so they share a check.
   */
  private notify(): void {
    if (this.wakeScheduled) return;
    this.wakeScheduled = true;
    setImmediate(() => {
      this.wakeScheduled = false;
      for (const wake of [...this.waiters]) wake();
    });
  }

  // ---- commit ----------------------------------------------------------------------------

  private async commit(request: CommitRequest): Promise<CommitReply> {
    this.checkDeadline(request.deadline_ts);
    const id = request.checkpoint_id;
    const { dir, refusal } = await this.checkpointDir(request.checkpoint_dir, { write: true });
    const invisible = await invisibleCheckpointDir(dir);
    const scopeKey = request.episode_ids === null ? "*" : [...new Set(request.episode_ids.map(captureKey))].sort().join(",");
    const args = `${dir}\u0000${scopeKey}\u0000${request.stop}`;
    const pending = await this.underLock(request, () => {
      const cached = this.cached<CommitReply>(id, "commit", args);
      if (cached) return cached;
      if (refusal) throw refusal;
      this.admit(id, ALLOWED.commit, "commit");
      const existing = this.pendingWrite;
      if (existing && existing.checkpointId === id) {
        if (existing.dir !== dir || existing.scopeKey !== scopeKey || existing.stop !== request.stop) {
          throw new CheckpointError("checkpoint_conflict", "a retried commit must name the same directory, scope and stop flag");
        }
      }
      // Readiness can regress after prepare (e.g. a held response was delivered).
      const report = this.report();
      if (!report.ready) {
        throw new CheckpointError("invalid_phase", `readiness regressed since prepare; blockers: ${report.blockers.join(", ")}`);
      }
      // Refused here, not by the kind's export: a refusal must change nothing (the lease below).
      if (request.episode_ids === null && this.adapter.scopeRequired) {
        throw new CheckpointError("invalid_request", `the ${this.adapter.kind} participant exports only the commit's episode_ids; a null scope is refused`);
      }
      if (request.episode_ids) {
        const restarts = new Set(report.restarts);
        const inScope = request.episode_ids.map(captureKey).filter((key) => restarts.has(key));
        if (inScope.length) throw new CheckpointError("restart_in_scope", `the scope names restarts: ${inScope.slice(0, 10).join(", ")}`);
      }
      // After the checks above (a retry's reply, phase, conflict), before the lease below.
      if (invisible) throw invisible;
      const write: PendingWrite<R> =
        existing && existing.checkpointId === id
          ? existing
          : {
              checkpointId: id,
              dir,
              scopeKey,
              stop: request.stop,
              createdAt: this.clock.now() / 1000,
              records: undefined,
              extra: undefined,
              gate: new WriteGate(),
              running: undefined,
              leaseBefore: undefined,
            };
      this.pendingWrite = write;
      // Only once nothing above refused; it covers the write up to this commit's deadline, and the
      // write's failure puts back the lease before it.
      this.renewLease(request.deadline_ts, write);
      // Joined here, under the lock: a failed write's clean-up (below, outside the lock) then runs
      // wholly before this step (this commit starts a write of its own) or after it (this commit
      // shares its failure). Joined after the lock, a clean-up landing in between dropped the write
      // this retry chose (it then wrote beside the participant's state, and answered stale_checkpoint)
      // or put back the lease this retry had just renewed.
      write.running ??= this.startWrite(write, request);
      return { write, running: write.running };
    });
    if (!("running" in pending)) return pending;

    // The write cannot be cancelled by a deadline; a retry awaits the same write.
    const reply = await this.raceDeadline(pending.running, request.deadline_ts, "commit");
    const done = await this.lock.run(() => {
      if (this.activeId !== id || this.pendingWrite !== pending.write) {
        throw new CheckpointError("stale_checkpoint", `checkpoint ${id} was resumed while its commit was writing`);
      }
      const cached = this.cached<CommitReply>(id, "commit", args);
      if (cached) return { reply: cached, hook: undefined };
      // Committed once the records are durable; the hook starts here, once, but runs outside the lock.
      this.phase = "committed";
      pending.write.leaseBefore = undefined; // its commits' renewals stand
      this.remember(id, "commit", reply, args);
      return { reply, hook: this.runAfterCommit(id, request) };
    });
    // Clean-up and parking are best effort (reference §3.5 step 7): the reply waits for them up to
    // the deadline, no longer, and a hook that hangs never holds the lock, so resume and lease
    // expiry still reopen admission.
    if (done.hook) {
      await this.raceDeadline(done.hook, request.deadline_ts, "after-commit hook").catch((error: unknown) => {
        this.logger?.warn({ checkpoint_id: id, err: error }, "after-commit hook still running at the commit deadline; replying committed");
      });
    }
    return done.reply;
  }

  /** Runs the write; its failure puts back what its commits changed, before they see it. */
  private startWrite(pending: PendingWrite<R>, request: CommitRequest): Promise<CommitReply> {
    return this.runWrite(pending, request).catch((error: unknown) => {
      pending.running = undefined;
      // Still this checkpoint's write (no resume or lease expiry since): its commits extended nothing.
      if (this.pendingWrite === pending && pending.leaseBefore !== undefined) {
        this.leaseExpiresAt = pending.leaseBefore;
        pending.leaseBefore = undefined;
        this.armLeaseTimer();
      }
      // Nothing was exported: the refusal leaves no write behind to pin this directory and scope.
      if (pending.records === undefined && this.pendingWrite === pending) this.pendingWrite = undefined;
      throw error;
    });
  }

  /** The kind's after-commit hook; it never rejects (its failures are only logged). */
  private async runAfterCommit(id: string, request: CommitRequest): Promise<void> {
    try {
      await this.adapter.afterCommit?.(request.episode_ids, { stop: request.stop });
    } catch (error) {
      // Best effort: the records are durable; clean-up and parking failures are only logged.
      this.logger?.warn({ checkpoint_id: id, err: error }, "after-commit hook failed");
    }
  }

  private async runWrite(pending: PendingWrite<R>, request: CommitRequest): Promise<CommitReply> {
    const target = { checkpointDir: pending.dir, checkpointId: pending.checkpointId, kind: this.adapter.kind, instance: this.instance };
    const parentAttrs = { [ATTR.kind]: this.adapter.kind, [ATTR.instance]: this.instance };
    // The commit op span that started this write (a retry awaits the same write).
    const opSpan = trace.getActiveSpan();
    if (!pending.records) {
      pending.records = await withSpan("export", parentAttrs, undefined, async (span) => {
        const exported = await this.adapter.exportRecords(request.episode_ids);
        const checked = exported.map((record, index) => {
          const parsed = this.adapter.recordSchema.safeParse(record);
          if (!parsed.success) throw new CheckpointError("internal_error", `exported record ${index} does not match the ${this.adapter.kind} record schema`);
          return parsed.data;
        });
        span.setAttribute(ATTR.records, checked.length);
        return checked;
      });
    }
    const records = pending.records;
    const extra = (pending.extra ??= this.adapter.manifestExtra?.() ?? {});
    const extras = this.adapter.commitExtras?.(records) ?? {};
    refuseUnsendableReply(target, records.length, pending.createdAt, extra, extras);
    const written = await withSpan("write", parentAttrs, undefined, async (span) => {
      const result = await this.storage.write(target, records, {
        gate: pending.gate,
        createdAt: pending.createdAt,
        extra,
        // Seen on arrival (invisibleCheckpointDir); never made again if it went since.
        existingCheckpointDir: true,
      });
      span.setAttributes({ [ATTR.records]: records.length, [ATTR.bytes]: result.bytes });
      return result;
    });
    opSpan?.setAttributes({ [ATTR.records]: records.length, [ATTR.bytes]: written.bytes });
    const instruments = participantInstruments();
    instruments.records.add(records.length, { op: "commit", kind: this.adapter.kind });
    instruments.bytes.add(written.bytes, { op: "commit", kind: this.adapter.kind });
    const restarts = this.report().restarts.length;
    if (restarts) instruments.episodes.add(restarts, { outcome: "restarted", kind: this.adapter.kind });
    return fitCommitReply({
      phase: "committed",
      manifest: written.manifest,
      manifest_path: written.manifestPath,
      manifest_sha256: written.manifestSha256,
      episode_ids: [...new Set(records.map((r) => captureKey(r.episode_id)))].sort(),
      extras,
    });
  }

  // ---- restore ---------------------------------------------------------------------------

  private async restore(request: RestoreRequest): Promise<RestoreReply> {
    const id = request.checkpoint_id;
    this.checkDeadline(request.deadline_ts, (late) => this.lateRestoreRefusal(id, late));
    // Every episode in scope continues as its next attempt: past MAX_ATTEMPT that attempt has no
    // capture key, and one rollout at two attempts would be installed and refused at once. The
    // codec refuses both on the wire; in-process callers hand requests straight to handle().
    const issue = restoreScopeIssue(request.episode_ids);
    if (issue) throw new CheckpointError("invalid_request", issue);
    const { dir, refusal } = await this.checkpointDir(request.checkpoint_dir);
    const scope = new Set(request.episode_ids.map(captureKey));
    // Not its manifest_sha256, compared apart (cached): a retry without a pin (an older coordinator)
    // is answered from what the first read installed, one pinning another manifest is a conflict.
    const args = `${dir}\u0000${[...scope].sort().join(",")}`;
    return this.underLock(request, async () => {
      const cached = this.cached<RestoreReply>(id, "restore", args, request.manifest_sha256);
      if (cached) return cached;
      if (refusal) throw refusal;
      this.admit(id, ALLOWED.restore, "restore");
      if (this.pendingInstall) await this.pendingInstall;
      if (this.lateInstall) throw this.notFresh("an earlier restore's install is still running past its deadline");
      const again = this.heldInstallFailure.repeat(id, args, this.adapter.hasLiveState());
      if (again) throw again;
      if (this.adapter.hasLiveState()) throw this.notFresh();
      const target = { checkpointDir: dir, checkpointId: id, kind: this.adapter.kind, instance: this.instance };
      // The digest the coordinator checked the manifest against: a manifest replaced since (or
      // between its check and this read) is refused here, before anything is installed.
      const pinned = request.manifest_sha256 === undefined ? undefined : { manifest_sha256: request.manifest_sha256 };
      const read = await withSpan("read", { [ATTR.kind]: this.adapter.kind, [ATTR.instance]: this.instance }, undefined, async (span) => {
        const result = await this.storage.read(target, this.adapter.recordSchema, (record) => scope.has(captureKey(record.episode_id)), pinned);
        span.setAttributes({ [ATTR.records]: result.records.length, [ATTR.bytes]: result.bytes });
        return result;
      });
      participantInstruments().records.add(read.records.length, { op: "restore", kind: this.adapter.kind });
      participantInstruments().bytes.add(read.bytes, { op: "restore", kind: this.adapter.kind });
      trace.getActiveSpan()?.setAttributes({ [ATTR.records]: read.records.length, [ATTR.bytes]: read.bytes });
      // A read that outlived the deadline installs nothing: the coordinator has given up on this
      // restore, and its clean-up (queued behind this lock) may itself run out of time. Live state
      // admitted meanwhile answers what it would in time (not fresh): deadline_exceeded would tell
      // the coordinator attempt+1 may be installed here.
      this.checkDeadline(request.deadline_ts, (late) => this.lateRestoreRefusal(id, late));

      let closed: boolean;
      try {
        closed = await this.closeWithinDeadline(id, request.deadline_ts, "restore");
      } catch (error) {
        // It may have closed part way (a kind stops admitting, then cuts what is in flight); the
        // phase stays idle, so no resume would reopen it: reopen here, as prepare does.
        await this.reopenWhileIdle(id, "restore_reopen_failed");
        throw error;
      }
      // Still running at the deadline: admission reopens once it ends (abandonLateClose).
      if (!closed) throw lateCloseRefusal("restore");
      // A call admitted while the records were read would be installed over: refuse, reopened. So
      // is a restore whose admission closed only past its deadline.
      if (this.adapter.hasLiveState() || request.deadline_ts * 1000 <= this.clock.now()) {
        await this.reopenWhileIdle(id, "restore_reopen_failed");
        throw this.adapter.hasLiveState() ? this.notFresh() : new CheckpointError("deadline_exceeded", "restore reached its deadline before the install could start");
      }
      this.closedAt = this.elapsedNow();
      const install = withSpan("install", { [ATTR.kind]: this.adapter.kind, [ATTR.instance]: this.instance, [ATTR.records]: read.records.length }, undefined, () =>
        this.adapter.install(read.records, read.manifest.extra),
      );
      let ended = false;
      const settled = install.then(
        () => void (ended = true),
        () => void (ended = true),
      );
      this.pendingInstall = settled;
      void settled.then(() => {
        if (this.pendingInstall === settled) this.pendingInstall = undefined;
      });
      try {
        await this.raceDeadline(install, request.deadline_ts, "restore");
      } catch (error) {
        if (ended) {
          await settled;
          // What it left installed (a free that failed) is retired by the clean-up this failure asks for.
          if (this.adapter.hasLiveState()) {
            error = heldStateFailure(error);
            this.heldInstallFailure.remember(id, args, error, request.episode_ids.map(nextAttempt));
          }
        } else {
          this.abandonLateInstall(id, settled, { args, error, next: request.episode_ids.map(nextAttempt) });
        }
        await this.reopenWhileIdle(id, "restore_reopen_failed");
        this.closedAt = undefined;
        throw error;
      }
      // Every episode in scope continues as its next attempt, never under its old identity (even
      // where this participant had no record of it): its source attempts are fenced until forget.
      for (const episode of request.episode_ids) this.restoredFrom.mark(episode);
      this.phase = "restored";
      this.activeId = id;
      this.resumedCommits.delete(id); // its commit reply (if this process made it) is no longer the state here
      participantInstruments().episodes.add(read.records.length ? new Set(read.records.map((r) => captureKey(r.episode_id))).size : 0, {
        outcome: "continued",
        kind: this.adapter.kind,
      });
      this.renewLease(request.deadline_ts);
      const reply: RestoreReply = {
        phase: "restored",
        source_checkpoint_id: id,
        restored: [...new Set(read.records.map((r) => captureKey(nextAttempt(r.episode_id))))].sort(),
        incarnation: this.incarnation,
      };
      // The digest of what was read, pinned or not: a pinned retry of an unpinned restore is checked too.
      this.remember(id, "restore", reply, args, read.manifestSha256);
      return reply;
    }, (late) => this.lateRestoreRefusal(id, late));
  }

  /**
   * Reopens admission closed by an op that failed, leaving the phase idle (a restore, or a close
   * that outlived its deadline), so neither a resume (idle: nothing to reopen) nor a lease would: a
   * reopen that fails (the kind's openAdmission threw) is tried again shortly under the lock, as a
   * lease expiry's is, for as long as no later op owns admission. Never throws: the op answers its
   * own refusal, whose code tells the coordinator whether anything was installed.
   */
  private async reopenWhileIdle(id: string, event: string): Promise<void> {
    try {
      await this.adapter.openAdmission();
    } catch (error) {
      this.logger?.error({ checkpoint_id: id, err: error }, event);
      const retry = (): void =>
        void this.lock.run(async () => {
          // A later prepare or restore closed (and owns) admission since, or a later close still runs
          // (its end reopens); dispose ends the retries.
          if (this.phase !== "idle" || this.activeId !== null || this.lateClose || this.disposed) return;
          try {
            await this.adapter.openAdmission();
          } catch (err) {
            this.logger?.error({ checkpoint_id: id, err }, event);
            this.armRetry(retry);
          }
        });
      this.armRetry(retry);
    }
  }

  /**
   * The kind's closeAdmission, under the lock, bounded by the closing op's deadline: one that never
   * settles (a custom kind's hook that hangs) would otherwise hold every later op, resume and lease
   * expiry included, for good. False when it is still running then (it is left to end on its own,
   * abandonLateClose), or when the deadline passed before it could start. A close still running from
   * an earlier op is waited for first (the kind never runs two closes at once), within this op's
   * deadline too.
   */
  private async closeWithinDeadline(id: string, deadlineTs: number, op: string): Promise<boolean> {
    const earlier = this.lateClose;
    const closing = (async () => {
      if (earlier) {
        await earlier;
        // Past this op's deadline already: closing now would only need reopening (the earlier close's end reopens).
        if (deadlineTs * 1000 <= this.clock.now()) return false;
      }
      await this.adapter.closeAdmission({ timeLeftMs: deadlineTs * 1000 - this.clock.now() });
      return true;
    })();
    let ended = false;
    const settled = closing.then(
      () => void (ended = true),
      () => void (ended = true),
    );
    try {
      return await this.raceDeadline(closing, deadlineTs, `${op}'s closeAdmission`);
    } catch (error) {
      if (ended) throw error; // the kind's own failure
      this.abandonLateClose(id, op, settled);
      return false;
    }
  }

  /**
   * A close that outlived its op's deadline: the op answers deadline_exceeded with the phase idle,
   * and admission reopens once the close ends, never beside it (a kind may close again as its hook
   * ends), unless a later prepare or restore owns admission by then, or a later late close will.
   */
  private abandonLateClose(id: string, op: string, settled: Promise<void>): void {
    this.lateClose = settled;
    this.logger?.warn({ checkpoint_id: id, op }, "close_admission_outlived_deadline");
    void settled.then(() => {
      if (this.lateClose === settled) this.lateClose = undefined;
      return this.lock.run(async () => {
        if (this.phase !== "idle" || this.activeId !== null || this.lateClose || this.disposed) return;
        await this.reopenWhileIdle(id, "late_close_reopen_failed");
      });
    });
  }

  /**
   * An install that outlived its restore's deadline may never end (a kind hook that hangs) or end
   * later having installed attempt+1 although the restore failed. Neither may hold the lock (every
   * later op would queue behind it for good) nor serve: attempt+1 is fenced now, as the
   * coordinator's clean-up retires it after a failed restore anyway, admission reopens for
   * everything else, and what the install leaves is freed once it ends.
   */
  private abandonLateInstall(id: string, settled: Promise<void>, failure: { args: string; error: unknown; next: EpisodeId[] }): void {
    const next = failure.next;
    for (const episode of next) this.retired.mark(episode);
    if (this.pendingInstall === settled) this.pendingInstall = undefined;
    this.logger?.warn({ checkpoint_id: id, episodes: next.length }, "restore_install_outlived_deadline");
    // A free that fails leaves the kind holding attempt+1 (retiring, a blocker), and the
    // coordinator's clean-up most likely ran before the install ended, so none would come back for
    // it: held like a failed install's state (the same restore re-sent gets its failure again, so a
    // successor's clean-up retires attempt+1 here), and freed again shortly, outside a checkpoint,
    // until it is or a retire or forget of it freed it.
    // That retire is a kind hook too, which may hang as the install did (the same provider): bounded,
    // so it never holds the lock for good (every later op, resume and lease expiry included, would
    // queue behind it), and never started again while an earlier one still runs.
    let running: Promise<void> | undefined;
    const free = (again: boolean): Promise<void> =>
      this.lock.run(async () => {
        // Disposed: the process is shutting down, and what the install left goes with it (the kind's
        // retire would run into a stopped server).
        if (this.disposed || (again && !this.heldInstallFailure.holds(id))) return;
        if (again && (this.phase !== "idle" || running)) return this.armRetry(retry);
        if (this.phase !== "idle") {
          // The install ended while a later prepare's checkpoint is open: the kind's retire must not
          // run inside it (it waits for clean-ups that wait for resume, and would hold that
          // checkpoint's commit behind it). Held meanwhile (attempt+1 stays fenced), freed once idle.
          if (!this.adapter.hasLiveState()) return;
          this.heldInstallFailure.remember(id, failure.args, failure.error, next);
          return this.armRetry(retry);
        }
        try {
          const retiring = this.adapter.retire(next);
          const ended = retiring.then(
            () => undefined,
            () => undefined,
          );
          running = ended;
          void ended.then(() => {
            if (running === ended) running = undefined;
          });
          // A duration, not an instant: a wall-clock step back must not hold the lock that much longer.
          await this.raceTimer(retiring, (fire) => this.clock.setTimer(fire, LATE_FREE_MS), `freeing a late restore install did not finish within ${LATE_FREE_MS} ms`);
          this.heldInstallFailure.retired(next);
          this.logger?.info({ checkpoint_id: id }, "late_restore_install_freed");
        } catch (err) {
          this.logger?.error({ checkpoint_id: id, err }, "late_restore_install_not_freed");
          if (!this.adapter.hasLiveState()) return;
          this.heldInstallFailure.remember(id, failure.args, failure.error, next);
          this.armRetry(retry);
        } finally {
          this.notify();
        }
      });
    const retry = (): void => void free(true);
    // Freed under the lock once it ended (no op waits for it there, so this cannot deadlock); until
    // then a restore is refused: its install would run beside this one.
    const freed = settled
      .then(() => free(false))
      .finally(() => {
        if (this.lateInstall?.freed === freed) this.lateInstall = undefined;
        this.notify();
      });
    this.lateInstall = { freed, rollouts: new Set(next.map((episode) => episode.rollout_id)) };
  }

  // ---- resume, renew ---------------------------------------------------------------------

  private async resume(request: ResumeRequest): Promise<ResumeReply> {
    const id = request.checkpoint_id;
    return this.underLock({ epoch: request.epoch }, async () => {
      // Still active although fenced: an earlier reopen of it failed; this one tries again.
      if (this.activeId === id) {
        await this.reopen(id);
        return { phase: "idle", idempotent: false };
      }
      if (this.resumed.has(id)) return { phase: "idle", idempotent: true };
      if (this.activeId === null) {
        // Remember it: a delayed prepare of an aborted checkpoint must not close admission.
        this.resumed.add(id);
        return { phase: "idle", idempotent: true };
      }
      throw new CheckpointError("checkpoint_conflict", `checkpoint ${this.activeId} is active, not ${id}`);
    });
  }

  private async renew(request: RenewRequest): Promise<RenewReply> {
    this.checkDeadline(request.deadline_ts);
    return this.underLock(request, () => {
      this.admit(request.checkpoint_id, ALLOWED.renew, "renew");
      this.renewLease(request.deadline_ts);
      return { lease_expires_at: this.leaseExpiresAt! };
    });
  }

  // ---- retire, forget --------------------------------------------------------------------

  private async retire(request: RetireRequest): Promise<RetireReply> {
    this.checkDeadline(request.deadline_ts);
    return this.underLock(request, async () => {
      this.admitOutsideCheckpoint(request.checkpoint_id, "retire");
      // Mark first: anything that arrives while the work is being stopped is already refused.
      for (const episode of request.episode_ids) this.retired.mark(episode);
      if (this.pendingInstall) await this.pendingInstall;
      await withSpan("retire", { [ATTR.kind]: this.adapter.kind, [ATTR.instance]: this.instance, [ATTR.episodes]: request.episode_ids.length }, undefined, () =>
        this.raceDeadline(this.unlessStopping(() => this.adapter.retire(request.episode_ids), "retire"), request.deadline_ts, "retire"),
      );
      // Only once it succeeded, as a commit's: a failed retire extends nothing (still under the
      // lock, so the lease cannot expire while the kind's retire runs).
      if (this.phase === "restored") this.renewLease(request.deadline_ts);
      this.heldInstallFailure.retired(request.episode_ids);
      this.notify();
      return { retired: [...new Set(request.episode_ids.map(captureKey))].sort() };
    });
  }

  private async forget(request: ForgetRequest): Promise<ForgetReply> {
    this.checkDeadline(request.deadline_ts);
    // A restore install past its deadline may still install the next attempt of these rollouts: its
    // fence stays until that install ended and what it left was freed (lifted before, a checkpoint
    // opened meanwhile would export it). Awaited outside the lock, under which the free runs; past
    // the deadline the marks stay, as for a forget whose hook hangs. Checked again once the lock is
    // held: a restore this forget queued behind may have become such a late install meanwhile.
    const lateOf = () => {
      const late = this.lateInstall;
      return late && request.rollout_ids.some((id) => late.rollouts.has(id)) ? late : undefined;
    };
    for (;;) {
      const late = lateOf();
      if (late) await this.raceDeadline(this.unlessStopping(() => late.freed, "forget"), request.deadline_ts, "forget");
      const reply = await this.underLock(request, () => (lateOf() ? undefined : this.forgetUnderLock(request)));
      if (reply) return reply;
    }
  }

  private async forgetUnderLock(request: ForgetRequest): Promise<ForgetReply> {
    this.admitOutsideCheckpoint(request.checkpoint_id, "forget");
    const rollouts = [...new Set(request.rollout_ids)].sort();
    // Bounded like retire's: a kind freeing held state through a hook that never answers (a
    // sandbox provider) must not hold the lock, or every later op, resume and lease expiry
    // included, would queue behind it for good. Past the deadline the marks stay.
    await this.raceDeadline(this.unlessStopping(() => this.adapter.forget(rollouts), "forget"), request.deadline_ts, "forget");
    // Only once it succeeded, as retire's: a failed forget extends nothing.
    if (this.phase === "restored") this.renewLease(request.deadline_ts);
    this.heldInstallFailure.forgotten(rollouts);
    for (const rollout of rollouts) {
      this.retired.forget(rollout);
      this.restoredFrom.forget(rollout);
    }
    return { forgotten: rollouts };
  }

  // ---- shared rules ----------------------------------------------------------------------

  /** The admission check of every phase-changing op: resumed fence, conflicting id, phase. */
  private admit(id: string, allowed: readonly Phase[], op: string): void {
    if (this.resumed.has(id)) throw new CheckpointError("stale_checkpoint", `checkpoint ${id} was already resumed`);
    if (this.activeId !== null && this.activeId !== id) {
      throw new CheckpointError("checkpoint_conflict", `checkpoint ${this.activeId} is active; ${op} for ${id} refused`);
    }
    if (!allowed.includes(this.phase)) throw new CheckpointError("invalid_phase", `${op} is not allowed in phase ${this.phase}`);
  }

  /** Retire and forget run only while no checkpoint is open: stopping an episode waits for its clean-up, which waits for resume. */
  private admitOutsideCheckpoint(id: string, op: string): void {
    if (this.phase !== "idle" && this.phase !== "restored") {
      throw new CheckpointError("invalid_phase", `${op} is refused while checkpoint ${this.activeId} is open (${this.phase}); resume first`);
    }
    if (this.phase === "restored" && this.activeId !== id) {
      throw new CheckpointError("checkpoint_conflict", `checkpoint ${this.activeId} is restored here; ${op} must name it`);
    }
  }

  /**
   * A guarded message addressed to another incarnation was meant for the process this one replaced:
   * acting on it (a resume would fence the id here) would mix two processes' checkpoints.
   */
  private checkIncarnation(op: PhaseOp, request: RequestOf<PhaseOp>): void {
    if (!GUARDED.has(op)) return;
    const addressed = (request as { incarnation?: string }).incarnation;
    if (addressed === undefined || addressed === this.incarnation) return;
    throw new CheckpointError(
      "stale_incarnation",
      `${op} of checkpoint ${request.checkpoint_id} is addressed to incarnation ${addressed}; this process is ${this.incarnation} and never took part`,
    );
  }

  /**
   * Runs an op under the lock, after the checks it repeats there (see fenceEpoch): its deadline, if
   * it has one, may have passed while it waited, and a newer leader's op may have been admitted.
   * `late`: what a request already past its deadline is refused with instead of deadline_exceeded.
   */
  private underLock<T>(request: { epoch: number; deadline_ts?: number }, fn: () => T | Promise<T>, late?: (refusal: CheckpointError) => CheckpointError): Promise<T> {
    return this.lock.run(() => {
      if (request.deadline_ts !== undefined) this.checkDeadline(request.deadline_ts, late);
      this.fenceEpoch(request.epoch);
      return fn();
    });
  }

  /**
   * Refuses an epoch the leader lease never issued (`invalid_request`, nothing changed): admitted,
   * a forged one would raise the fence above the sitting leader's epoch and refuse its every message.
   */
  private async checkIssued(epoch: number): Promise<void> {
    if (await this.isIssued(epoch)) return;
    throw new CheckpointError("invalid_request", `epoch ${epoch} is above every epoch the leader lease has issued: no coordinator holds it (a forged or corrupted message)`);
  }

  /** Asks the lease only about an epoch above any seen or confirmed here (once per leader term, normally). */
  private async isIssued(epoch: number): Promise<boolean> {
    if (!this.epochIssued || epoch <= Math.max(this.highestEpoch, this.confirmedEpoch)) return true;
    const issued = await this.epochIssued(epoch);
    if (issued) this.confirmedEpoch = Math.max(this.confirmedEpoch, epoch);
    return issued;
  }

  private checkEpoch(epoch: number): void {
    if (epoch < this.highestEpoch) throw new CheckpointError("stale_epoch", `epoch ${epoch} is below ${this.highestEpoch}, already seen here`);
  }

  /**
   * First thing every op does once it holds the lock. The check is repeated because a newer
   * leader's op may have been admitted while this one waited. The fence rises here, on admission,
   * not on success: an authenticated, schema-valid op that got this far proves its leader exists,
   * even if a phase check then refuses it, and an older leader's op must not run after it (nor
   * stop its commit's write). Refusals before this point (input, deadline, incarnation, epoch)
   * leave it unchanged.
   */
  private fenceEpoch(epoch: number): void {
    this.checkEpoch(epoch);
    this.highestEpoch = Math.max(this.highestEpoch, epoch);
  }

  /**
   * A restore past its deadline that this process would refuse in time (already resumed, another
   * checkpoint active, not fresh) gets that refusal: deadline_exceeded would tell the coordinator it
   * may have installed attempt+1 here, and its clean-up would fence rollouts this process runs.
   * While anything of a restore may be installed here (it is active, installing, or held), it stays late.
   */
  private lateRestoreRefusal(id: string, late: CheckpointError): CheckpointError {
    if (this.activeId === id || this.pendingInstall || this.lateInstall || this.heldInstallFailure.holds(id)) return late;
    try {
      this.admit(id, ALLOWED.restore, "restore");
    } catch (refusal) {
      return toCheckpointError(refusal);
    }
    return this.adapter.hasLiveState() ? this.notFresh() : late;
  }

  private notFresh(why = "this participant holds live state"): CheckpointError {
    return new CheckpointError("invalid_checkpoint_state", `restore needs a fresh process: ${why}`);
  }

  /** On arrival and again once the lock is held, before any state change: an op queued past its deadline does nothing. */
  private checkDeadline(deadlineTs: number, late?: (refusal: CheckpointError) => CheckpointError): void {
    if (deadlineTs * 1000 <= this.clock.now()) {
      const refusal = new CheckpointError("deadline_exceeded", DEADLINE_PASSED);
      throw late ? late(refusal) : refusal;
    }
    if (deadlineTs * 1000 > this.clock.now() + MAX_DEADLINE_AHEAD_S * 1000) {
      throw new CheckpointError("invalid_request", `${DEADLINE_TOO_FAR} ${MAX_DEADLINE_AHEAD_S} s ahead (seconds, not milliseconds)`);
    }
  }

  private get stopping(): boolean {
    return this.stopSignal.signal.aborted;
  }

  /**
   * A retire or forget, cut short with `unreachable` once this process stops serving: the kind's
   * wait for the attempt's in-flight calls would otherwise hold the shutdown until the op's deadline
   * (a minute by default), since the server cuts those calls only after the participant stopped.
   * Its marks go with the process; the controller sends the op again to its restart, as to any
   * participant gone meanwhile. Not for commit or restore: their late outcome is handled on its own.
   */
  private async unlessStopping<T>(work: () => Promise<T>, op: string): Promise<T> {
    const refusal = () => new CheckpointError("unreachable", `${op} cut short: this participant is shutting down; send it again once it is back`);
    if (this.stopping) throw refusal();
    let onStop!: () => void;
    const stopped = new Promise<never>((_, reject) => (onStop = () => reject(refusal())));
    this.stopSignal.signal.addEventListener("abort", onStop, { once: true });
    try {
      return await Promise.race([work(), stopped]);
    } finally {
      this.stopSignal.signal.removeEventListener("abort", onStop);
    }
  }

  private raceDeadline<T>(work: Promise<T>, deadlineTs: number, op: string): Promise<T> {
    return this.raceTimer(work, (fire) => setTimerAt(this.clock, fire, deadlineTs * 1000), `${op} did not finish before its deadline`);
  }

  /** `work`, or `deadline_exceeded` (`why`) once the timer `arm` sets fires first. */
  private async raceTimer<T>(work: Promise<T>, arm: (fire: () => void) => () => void, why: string): Promise<T> {
    let cancel: (() => void) | undefined;
    const timeout = new Promise<never>((_, reject) => {
      cancel = arm(() => reject(new CheckpointError("deadline_exceeded", why)));
    });
    try {
      return await Promise.race([work, timeout]);
    } finally {
      cancel?.();
    }
  }

  /**
   * The normalized checkpoint_dir, and the root check's refusal if any. That refusal is returned,
   * not thrown: the op throws it after its kept-reply check and before it changes anything, so a
   * storage hiccup (EIO, ESTALE, EACCES) at a re-drive does not refuse a commit or restore this
   * participant already answered, while one not answered yet is still refused before anything is
   * written. The textual check throws: it depends on the request alone, which a kept reply passed.
   */
  private async checkpointDir(dir: string, options: { write?: boolean } = {}): Promise<{ dir: string; refusal: CheckpointError | undefined }> {
    const normalized = normalize(dir).replace(/\/+$/, "") || "/";
    if (this.checkpointRoot && !normalized.startsWith(`${this.checkpointRoot}/`)) {
      throw new CheckpointError("invalid_request", `checkpoint_dir must lie inside ${this.checkpointRoot}`);
    }
    if (!this.checkpointRoot) return { dir: normalized, refusal: undefined };
    try {
      await this.refuseRootEscape(normalized, this.checkpointRoot, options.write === true);
      return { dir: normalized, refusal: undefined };
    } catch (error) {
      // As the endpoint would answer it: a raw stat or readdir failure is storage_error.
      return { dir: normalized, refusal: toCheckpointError(error) };
    }
  }

  /**
   * The textual check does not see symlinks: mkdir -p and open follow them anywhere below the
   * checkpoint directory (`<dir>/gym` → elsewhere writes there, and a restore reads from there).
   * So every existing component of `<dir>/gym/<kind>/<instance>` must be a directory resolving
   * inside the root (up to `<dir>` a symlink to elsewhere in the root is fine; a dangling one is
   * refused, mkdir would fail on it), below `<dir>` none may be a symlink at all (the coordinator's
   * restore and verify refuse a participant directory reached through one: its checkpoint would be
   * published, never restored), and no file in the participant directory may be a symlink. Checked
   * before anything is created; the storage opens manifest and records with O_NOFOLLOW besides.
   */
  private async refuseRootEscape(dir: string, root: string, write: boolean): Promise<void> {
    const realRoot = await realpathOrUndefined(root);
    if (realRoot === undefined) {
      // The coordinator creates the root at start-up and every checkpoint directory in it: one
      // missing here is a shared filesystem not mounted on this host (or a path another process
      // does not see). mkdir -p would make it on the local disk and commit there, and the checkpoint
      // would be published with files nothing else can read (its restore finds no manifest).
      if (write) throw new CheckpointError("storage_error", `ENOENT: checkpoint root ${root} does not exist on this host (is the shared filesystem mounted here?); a commit does not create it`);
      return; // nothing under a missing root exists, so no symlink either
    }
    const target = participantDir({ checkpointDir: dir, checkpointId: "", kind: this.adapter.kind, instance: this.instance });
    const escape = (detail: string) => new CheckpointError("invalid_request", `checkpoint_dir: ${detail} (checkpoint root ${root})`);
    let path = root;
    for (const name of target.slice(root.length + 1).split("/").filter(Boolean)) {
      path = `${path}/${name}`;
      let info = await lstatOrUndefined(path);
      if (info === undefined) return; // nothing below exists yet
      if (info.isSymbolicLink()) {
        if (path.length > dir.length) throw escape(`${path} is a symbolic link (below the checkpoint directory none may be)`);
        const real = await realpathOrUndefined(path);
        if (real === undefined) throw escape(`${path} is a symbolic link to nothing`);
        if (real !== realRoot && !real.startsWith(`${realRoot}/`)) throw escape(`${path} resolves outside the root (a symlink)`);
        info = await stat(path);
      }
      if (!info.isDirectory()) throw escape(`${path} is not a directory`);
    }
    for (const entry of await readdir(path, { withFileTypes: true })) {
      if (entry.isSymbolicLink()) throw escape(`${path}/${entry.name} is a symbolic link`);
    }
  }

  /** The reply this (id, op) already got; a retry asking something else is a conflict, not a replay. */
  private cached<T>(id: string, op: string, args = "", pin?: string): T | undefined {
    const entry = this.cache.get(cacheKey(id, op)) ?? (op === "commit" && this.resumed.has(id) ? this.resumedCommits.get(id) : undefined);
    if (!entry) return undefined;
    if (entry.args !== args) {
      throw new CheckpointError("checkpoint_conflict", `a retried ${op} of ${id} must name the same directory and scope${op === "commit" ? " and stop flag" : ""}`);
    }
    // A restore pinning another manifest than the one installed asks about other records (no pin: a
    // coordinator older than this one, which sends none, gets the cached reply).
    if (pin !== undefined && entry.pin !== pin) {
      throw new CheckpointError("checkpoint_conflict", `a retried ${op} of ${id} pins manifest ${pin}, not ${entry.pin}, which it installed`);
    }
    return entry.reply as T;
  }

  private remember(id: string, op: string, reply: unknown, args = "", pin?: string): void {
    this.cache.set(cacheKey(id, op), { reply, args, ...(pin !== undefined && { pin }) });
  }

  private report(): PrepareReport {
    const readiness = this.adapter.readiness();
    return {
      ready: readiness.blockers.length === 0,
      blockers: readiness.blockers.slice(0, MAX_BLOCKERS),
      blocker_count: readiness.blockers.length,
      counts: readiness.counts,
      restarts: readiness.restarts,
      ...(this.adapter.scopeRequired ? { scope_required: true } : {}),
    };
  }

  /** `byCommit`: the write whose commit renews, whose failure puts back the lease before it. */
  private renewLease(deadlineTs: number, byCommit?: PendingWrite<R>): void {
    const candidate = deadlineTs + this.graceSeconds;
    const write = this.pendingWrite;
    if (write && write === byCommit) write.leaseBefore ??= this.leaseExpiresAt;
    else if (write?.leaseBefore !== undefined) write.leaseBefore = Math.max(write.leaseBefore ?? 0, candidate);
    this.leaseExpiresAt = Math.max(this.leaseExpiresAt ?? 0, candidate);
    this.armLeaseTimer();
  }

  /**
   * Arms `retry` LEASE_RETRY_MS from now, tracked so dispose cancels it; nothing once disposed (the
   * retries reopen admission or free state through the kind, which must not run into a stopped server).
   */
  private armRetry(retry: () => void): void {
    if (this.disposed) return;
    const cancel = this.clock.setTimer(() => {
      this.retryTimers.delete(cancel);
      retry();
    }, LEASE_RETRY_MS);
    this.retryTimers.add(cancel);
  }

  private armLeaseTimer(): void {
    this.cancelLeaseTimer?.();
    this.cancelLeaseTimer = undefined;
    // Disposed: the process is shutting down, and nothing may fire into the kind any more (a commit
    // write that outlived its deadline and fails later puts back its lease through here).
    if (this.disposed) return;
    const id = this.activeId;
    this.cancelLeaseTimer = setTimerAt(this.clock, () => void this.onLeaseTimer(id), (this.leaseExpiresAt ?? 0) * 1000);
  }

  /** An abandoned checkpoint resumes by itself, exactly as a resume would (and fences the id). */
  private async onLeaseTimer(id: string | null): Promise<void> {
    await this.lock.run(async () => {
      // Disposed while this expiry waited for the lock: no reopen into a stopped server.
      if (this.disposed || this.activeId === null || this.activeId !== id || this.leaseExpiresAt === null) return;
      // Early (the wall clock was stepped back): wait for the rest, or the lease would never expire.
      if (this.clock.now() < this.leaseExpiresAt * 1000) return this.armLeaseTimer();
      this.logger?.warn({ checkpoint_id: id, phase: this.phase }, "lease_expired");
      participantInstruments().leaseExpiries.add(1, { kind: this.adapter.kind, phase: this.phase });
      try {
        await this.reopen(id);
      } catch (error) {
        // The lease is the way out when the coordinator is gone: a reopen that failed (a kind's
        // openAdmission threw) is tried again shortly, never left to an unhandled rejection.
        this.logger?.error({ checkpoint_id: id, err: error }, "lease_expiry_reopen_failed");
        if (this.activeId === id && !this.disposed) this.cancelLeaseTimer = this.clock.setTimer(() => void this.onLeaseTimer(id), LEASE_RETRY_MS);
      }
    });
  }

  /** Resume, lease expiry and a failed prepare all come back to idle through here. Runs under the lock. */
  private async reopen(resumedId: string | undefined): Promise<void> {
    // Fenced first: should the kind's openAdmission throw (the phase stays, the reopen is tried
    // again), a late commit or renew must not bring back a checkpoint its write was stopped for.
    if (resumedId !== undefined) {
      this.resumed.add(resumedId);
      const committed = this.cache.get(cacheKey(resumedId, "commit"));
      if (committed) {
        this.resumedCommits.set(resumedId, committed);
        for (const id of this.resumedCommits.keys()) if (this.resumedCommits.size > RESUMED_COMMITS_KEPT) this.resumedCommits.delete(id);
      }
      for (const key of [...this.cache.keys()]) if (key.startsWith(`${resumedId}\u0000`)) this.cache.delete(key);
    }
    const write = this.pendingWrite;
    this.pendingWrite = undefined;
    if (write) await write.gate.stop();
    if (this.pendingInstall) await this.pendingInstall;
    await this.adapter.openAdmission();
    if (this.closedAt !== undefined) {
      participantInstruments().pause.record((this.elapsedNow() - this.closedAt) / 1000, { kind: this.adapter.kind, participant: this.instance });
      this.closedAt = undefined;
    }
    this.phase = "idle";
    this.activeId = null;
    this.leaseExpiresAt = null;
    this.cancelLeaseTimer?.();
    this.cancelLeaseTimer = undefined;
    this.notify();
  }

  /**
   * The process stops serving (shutdown, or its name taken over): a prepare waiting for readiness
   * answers now as not prepared (`preparing`, with its blockers) instead of at its deadline, so
   * the endpoint's wait for in-flight answers does not hold the process until then.
   */
  beginStopping(): void {
    this.stopSignal.abort();
    this.notify();
  }

  /**
   * Stops timers (no lease expiry fires after it, even one a late write failure would arm, nor a
   * retry of a failed reopen or of a late install's free); used when the process shuts down.
   */
  dispose(): void {
    this.disposed = true;
    this.beginStopping();
    this.unobserve();
    this.cancelLeaseTimer?.();
    for (const cancel of this.retryTimers) cancel();
    this.retryTimers.clear();
    this.notify();
  }
}

/** Outcome attributes of a phase op's span, in the shared namespace. */
function spanResult(span: Span, op: PhaseOp, result: unknown): void {
  switch (op) {
    case "prepare": {
      const r = result as PrepareReply;
      span.setAttributes({ [ATTR.phase]: r.phase, [ATTR.blockers]: r.report.blocker_count });
      return;
    }
    case "commit":
      span.setAttribute(ATTR.episodes, (result as CommitReply).episode_count ?? (result as CommitReply).episode_ids!.length);
      return;
    case "restore":
      span.setAttribute(ATTR.episodes, (result as RestoreReply).restored.length);
      return;
    case "retire":
      span.setAttribute(ATTR.episodes, (result as RetireReply).retired.length);
      return;
    case "forget":
      span.setAttribute(ATTR.rollouts, (result as ForgetReply).forgotten.length);
      return;
    default:
      return;
  }
}

/** How many resumed checkpoints keep their commit reply (a successor re-drives only the newest). */
const RESUMED_COMMITS_KEPT = 4;

/** The resolved path, or undefined when it does not exist (yet). */
async function realpathOrUndefined(path: string): Promise<string | undefined> {
  try {
    return await realpath(path);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT" || code === "ENOTDIR") return undefined;
    throw unresolvable(error);
  }
}

/** lstat, or undefined when nothing is there; other failures refuse the checkpoint_dir. */
async function lstatOrUndefined(path: string): Promise<Stats | undefined> {
  try {
    return await lstat(path);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return undefined;
    throw unresolvable(error);
  }
}

/**
 * A commit writes only into a checkpoint directory that exists: the coordinator makes it before it
 * sends any commit, so one missing here lies on storage this host does not see (a checkpoint
 * storage not mounted here leaves its mount point's empty local directory: mkdir -p would commit to
 * the local disk, and the published checkpoint's restore would find nothing). The refusal, if any
 * (thrown after the kept-reply check and before anything changes: the participant stays prepared,
 * its lease as it was); a path that does not resolve (EIO, ESTALE, ELOOP) is refused likewise.
 */
async function invisibleCheckpointDir(dir: string): Promise<CheckpointError | undefined> {
  let info: Stats | undefined;
  try {
    info = await stat(dir);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    // Returned, not thrown: a retried commit this participant already answered gets its kept reply.
    if (code !== "ENOENT" && code !== "ENOTDIR") return unresolvable(error);
  }
  if (info?.isDirectory()) return undefined;
  return new CheckpointError(
    "storage_error",
    `${info ? "ENOTDIR" : "ENOENT"}: checkpoint directory ${dir}, which the coordinator created before this commit, is not ${info ? "a directory" : "visible"} on this host (is the checkpoint storage mounted here?); a commit does not create it, nothing was written`,
  );
}

/**
 * A checkpoint_dir path the file system would not resolve: the storage refusing (EACCES, EIO, a
 * stale handle) is `storage_error`, as for the directory's listing; anything else (a symlink loop,
 * ELOOP) is the request's directory, `invalid_request`.
 */
function unresolvable(error: unknown): CheckpointError {
  if (isUnreadableStorage(error)) return toCheckpointError(error);
  return new CheckpointError("invalid_request", `checkpoint_dir cannot be resolved: ${(error as NodeJS.ErrnoException).code ?? String(error)}`, { cause: error });
}

/**
 * Refuses, before anything is written, a commit whose reply could not travel even without its
 * episode list (fitCommitReply leaves only that out): an adapter's manifest extra (within the
 * manifest's own limit) and commit extras can add up past one control message. Published, its
 * records would be answered reply_too_large at every try and the checkpoint never completed.
 * Measured on the reply as it will be, digests and counts at their real lengths.
 */
function refuseUnsendableReply(target: ParticipantTarget, count: number, createdAt: number, extra: Record<string, unknown>, extras: Record<string, unknown>): void {
  const digest = "0".repeat(64);
  const smallest: CommitReply = {
    phase: "committed",
    manifest: {
      schema_version: MANIFEST_SCHEMA_VERSION,
      kind: target.kind,
      instance: target.instance,
      checkpoint_id: target.checkpointId,
      records_file: `records-${digest}.jsonl`,
      records_sha256: digest,
      record_count: count,
      created_at: createdAt,
      extra,
    },
    manifest_path: join(PARTICIPANTS_DIR, target.kind, target.instance, MANIFEST_FILE),
    manifest_sha256: digest,
    episode_ids: null,
    episode_count: count,
    episode_ids_sha256: digest,
    extras,
  };
  const bytes = Buffer.byteLength(JSON.stringify(smallest));
  if (bytes > MAX_CONTROL_MESSAGE_BYTES) {
    throw new CheckpointError(
      "payload_too_large",
      `the commit reply of ${target.kind}/${target.instance} would be at least ${bytes} bytes, over the ${MAX_CONTROL_MESSAGE_BYTES}-byte control-message limit (the adapter's manifest extra and commit extras are too large); nothing was written`,
    );
  }
}

function lateCloseRefusal(op: string): CheckpointError {
  return new CheckpointError("deadline_exceeded", `${op} reached its deadline while the kind was still closing admission; it reopens once that close ends`);
}

/** A kept reply: `args` a retry must repeat; `pin` the manifest digest a restore installed, when its request named one. */
interface CachedReply {
  reply: unknown;
  args: string;
  pin?: string;
}

function cacheKey(id: string, op: string): string {
  return `${id}\u0000${op}`;
}

