import { join } from "node:path";
import type { Context } from "@opentelemetry/api";
import type { Logger } from "pino";
import {
  isPassableEpoch,
  CheckpointError,
  equalJitter,
  GUARDED_OPS,
  MAX_DEADLINE_AHEAD_S,
  MAX_INCARNATION_CHARS,
  memberKey,
  MEMBER_TTL_MS,
  PREPARE_STAGES,
  RESTORE_REFUSALS,
  RESUME_STAGES,
  RETIRE_STAGES,
  GLOBAL_MANIFEST_FILE,
  PARTICIPANTS_DIR,
  canonicalJson,
  captureKey,
  isStorageFailure,
  isUnreadableStorage,
  FailureSpellLog,
  namesCheckpoint,
  outsideCheckpointId,
  nextAttempt,
  commitScopeIssue,
  restoreScopeIssue,
  toCheckpointError,
  type ControllerState,
  type ControllerStateInput,
  type CtlReplyOf,
  type CtlRequestOf,
  type EpisodeId,
  type GlobalManifest,
  type Op,
  type ParticipantEntry,
  type ReplyOf,
  type RequestOf,
} from "../../protocol/index.js";
import { MAX_JOURNAL_ENTRY_BYTES, assertJournalEntryFits, type DecisionJournal, type JournalEntry, type RestoreOutcome } from "../ha/decision-journal.js";
import type { Leadership } from "../ha/leadership.js";
import type { MembershipSource, UnreadableMember } from "../membership/member-registry.js";
import type { CheckpointCatalog } from "../publication/checkpoint-catalog.js";
import { checkCommittedRecords, committedEpisodeIds } from "../publication/committed-records.js";
import { trashCheckpointDir } from "../publication/retention.js";
import type { GlobalManifestWriter } from "../publication/global-manifest-writer.js";
import { catalogListing, latestOrNone } from "../publication/catalog-listing.js";
import { coordinatorTelemetry, inFanOutSpan, inSpan, SPAN_ATTR } from "../telemetry/coordinator-telemetry.js";
import { AsyncLock } from "./async-lock.js";
import { cleanupStageDeadline, RESTORE_CLEANUP_MS, sentAgainUntil, type SentAgain } from "./cleanup-window.js";
import { newCheckpointId } from "./checkpoint-id.js";
import type { Clock } from "./clock.js";
import { Cancellation } from "./cancellation.js";
import { ReplacedProcessFailure } from "./transport.js";
import { combinedFailure, failureRefs, type Outcome, type ParticipantClient, type ParticipantRef } from "./participant-client.js";
import { runAll, runStages, type StagedRun } from "./phase-driver.js";

/** The coordinator-side phase of the one checkpoint (or restore) it has open. */
/** `restoring`: a restore sent and not yet settled (a controller's status tells it from a prepare). */
export type OpenPhase = "preparing" | "prepared" | "committing" | "committed" | "published" | "restoring" | "restored";

/** A retire or forget that named no checkpoint and ran outside any (see outsideSpells). */
function isOutsideOp(name: string, id: string | undefined): boolean {
  return id === undefined && (name === "retire" || name === "forget");
}

interface OpenCheckpoint {
  id: string;
  phase: OpenPhase;
  /** prepare_incomplete was logged as a warning: a controller polling prepare with this id gets info lines after it. */
  incompleteWarned?: boolean;
  epoch: number;
  members: ParticipantRef[];
  /**
   * The process incarnation each member's guarded messages are addressed to: the membership view's
   * when the checkpoint opened, or the one a restore reply named. A process started since refuses
   * them (`stale_incarnation`): it never took part, and a late resume would fence the id there (so
   * a restore of it would be refused).
   */
  incarnations: Map<string, string>;
  /** The membership view's incarnations when the checkpoint opened (a view that lags shows these). */
  viewed: Map<string, string>;
  preparedAt: number;
  /** Journaled as `opened_epoch` and `opened_seq` (see JournalEntrySchema): kept from the entry a recovery found. */
  openedEpoch: number;
  openedSeq: number | undefined;
  restarts: string[];
  /** Members whose prepare report said they export only a scope (`scope_required`): a null-scope commit is refused. */
  scopeRequiredBy?: string[];
  dir: string | null;
  scope: EpisodeId[] | null;
  stop: boolean;
  autoPublish: boolean;
  controllerState: ControllerStateInput | null;
  commit?: CommitResult;
  publish?: CtlReplyOf<"publish">;
  restore?: CtlReplyOf<"restore">;
  /**
   * Members of a restored checkpoint found restarted when its resume reached them: the new process
   * lost the restored state, so the restore is no longer all or nothing (see resumeRestored).
   */
  lostRestorers?: Map<string, string>;
  /** Where the restore's clean-up retires attempt+1 (journaled with `restore_cleanup`; default every member). */
  retireAt?: ParticipantRef[];
  /**
   * A restore's: each member's manifest_sha256 as checkpoint.json records it (read again by a
   * successor, never journaled), sent in its restore so it installs only that manifest.
   */
  manifestDigests?: Map<string, string>;
  /**
   * A restore's (opened here): how the id's previous restore settled, as the journal recorded it
   * when this one opened (or, that restore's entry still there, as its removal scheduled here is to
   * record it: restoreRecords). This restore's entry takes that record's place; removed after this
   * one changed nothing (refused everywhere, or its write failed), it writes the record back.
   */
  outcomeBefore?: RestoreOutcome;
  /**
   * The members any prepare of this checkpoint was sent (a prepare that stopped at a stage: its
   * stages up to that one): the later stages' members are idle, and a renew there would be
   * refused. Every member once a prepare went through; unset for a recovered checkpoint (all).
   */
  reached?: ParticipantRef[];
  log?: Logger;
}

/** A restore's first send (not a recovery's re-drive): what its opening forgot (forgetRestoreHistory's put-back), and the leader term it opened in. */
interface FirstRestoreSend {
  putBack: () => void;
  term: number;
}

/** A closed checkpoint whose resume failed at `members`, and how its messages were addressed (as `OpenCheckpoint`'s). */
interface Unresumed {
  members: ParticipantRef[];
  incarnations: Map<string, string>;
  viewed: Map<string, string>;
}

/** A restore whose clean-up ran here: what its controller was answered, and the processes it was sent to. */
interface FailedRestore {
  scope: EpisodeId[] | null;
  members: ParticipantRef[];
  /** As `OpenCheckpoint.incarnations` and `viewed` when the clean-up ran: the processes that resumed the id. */
  incarnations: Map<string, string>;
  viewed: Map<string, string>;
  message: string;
  data: Record<string, unknown>;
}

/** The commit reply as the engine keeps it: every participant's entry in full, as checkpoint.json gets it. */
type CommitResult = CtlReplyOf<"commit"> & { participants: ParticipantEntry[] };

/** Test-only fault injection points (the daemon maps GYM_CKPT_TEST_CRASH_AT onto them). */
export interface EngineHooks {
  beforeDecision?: (checkpointId: string) => void | Promise<void>;
  afterDecision?: (checkpointId: string) => void | Promise<void>;
  /** Awaited before checkpoint.json is written. */
  beforePublication?: (checkpointId: string) => void | Promise<void>;
  /** The convenience op's resume (overlapping its publication) is done. */
  afterResume?: (checkpointId: string) => void | Promise<void>;
  /** Awaited before a closed checkpoint's journal entry is removed; a throw fails that removal (as a KV timeout would). */
  beforeJournalRemove?: (checkpointId: string) => void | Promise<void>;
}

export interface CheckpointEngineOptions {
  deployment: string;
  client: ParticipantClient;
  membership: MembershipSource;
  leadership: Leadership;
  journal: DecisionJournal;
  catalog: CheckpointCatalog;
  writer: GlobalManifestWriter;
  clock: Clock;
  logger: Logger;
  /** Deadline of an op whose request names none. */
  defaultTimeoutMs: number;
  /** Timeout of the status probe. */
  statusTimeoutMs?: number;
  /**
   * Refuse controller ops (`not_leader`) until `recover()` ran under the current leadership (the
   * daemon): a lease that just became ready has not completed its predecessor's work yet.
   */
  requireRecovery?: boolean;
  /**
   * Participants every checkpoint must include (config `expected_participants`): one the membership
   * registry does not list is an `unreachable` blocker of its prepare stage, so nothing is published.
   */
  expected?: readonly ParticipantRef[];
  hooks?: EngineHooks;
}

/** Pause before the first retry of a failed journal-entry removal, doubled per try up to the cap (each jittered). */
const JOURNAL_REMOVE_RETRY_MS = 100;
const JOURNAL_REMOVE_RETRY_MAX_MS = 5000;
/** How long a restore's resume waits for its entry's removal at least, when its deadline is (nearly) spent. */
const JOURNAL_REMOVE_WAIT_MIN_MS = 2000;

/** Restore refusals of a participant parked in another checkpoint: a restore refused so still resumes everyone. */
const PARKED_ELSEWHERE: ReadonlySet<string> = new Set(["invalid_phase", "checkpoint_conflict"]);

/** How many failing retire/forget keys (op and participant) outside any checkpoint keep their log spell. */
const REMEMBERED_SPELLS = 1024;
/** How many recently closed checkpoints keep their replies for retries. */
const REMEMBERED_CHECKPOINTS = 8;
/** Participants' committed files a restore reads (and checks) at once before sending anything. */
const MANIFEST_READS_AT_ONCE = 64;
/** How long the resume of an aborted checkpoint (a failed prepare) may take at least. */
const ABORT_RESUME_MS = 3000;

/**
 * How many closed checkpoint ids a leader keeps (resume idempotent, prepare `stale_checkpoint`):
 * the most recent ones. One per checkpoint for the life of the process would grow without bound
 * under frequent checkpoints; a successor keeps none, and participants fence their last 64.
 */
export const REMEMBERED_CLOSED = 4096;

/** Ops addressed to the incarnation recorded when the checkpoint opened (see protocol GUARDED_OPS). */
const GUARDED: ReadonlySet<Op> = new Set<Op>(GUARDED_OPS);

type Failure = Extract<Outcome<Op>, { ok: false }>;

function refName(m: ParticipantRef): string {
  return `${m.kind}/${m.instance}`;
}

function statusOf(statuses: Outcome<"status">[], m: ParticipantRef): Outcome<"status"> | undefined {
  return statuses.find((s) => s.participant.kind === m.kind && s.participant.instance === m.instance);
}

/** The members whose status shows them still holding checkpoint `id` (not idle in it). */
function holdersOf(members: readonly ParticipantRef[], statuses: Outcome<"status">[], id: string): ParticipantRef[] {
  return members.filter((m) => {
    const o = statusOf(statuses, m);
    return o?.ok === true && o.reply.checkpoint_id === id && o.reply.phase !== "idle";
  });
}

/** Whether member `m` may still hold checkpoint `id`: its status shows it, or it did not answer. */
function mayHoldAt(m: ParticipantRef, statuses: Outcome<"status">[], id: string): boolean {
  const o = statusOf(statuses, m);
  return o?.ok !== true || (o.reply.checkpoint_id === id && o.reply.phase !== "idle");
}

/** Whether any member may still hold checkpoint `id`. */
function mayHold(members: readonly ParticipantRef[], statuses: Outcome<"status">[], id: string): boolean {
  return members.some((m) => mayHoldAt(m, statuses, id));
}

function failuresOf<O extends Op>(outcomes: Outcome<O>[]): Failure[] {
  return outcomes.filter((o): o is Extract<Outcome<O>, { ok: false }> => !o.ok);
}

/**
 * A clean-up's retire or resume that still failed when it ended; `unlisted`: given up before its
 * deadline because the membership registry no longer listed the participant (sentAgainUntil).
 */
type CleanupFailure = Failure & { unlisted?: true };

/** The failures sentAgainUntil left, those it gave up marked so. */
function cleanupFailures(sent: SentAgain<Failure>): CleanupFailure[] {
  return [...sent.left, ...sent.unlisted.map((f) => ({ ...f, unlisted: true as const }))];
}

/** One clean-up failure as a restore_failed detail names it (the participant's detail cut to 200 characters). */
function cleanupFailureNamed(f: CleanupFailure): string {
  const given = f.unlisted ? ` (not in the membership registry any more: no heartbeat within ${MEMBER_TTL_MS / 1000} s, so not sent again)` : "";
  return `${refName(f.participant)} (${f.code}: ${f.detail.slice(0, 200)})${given}`;
}

/**
 * What a restore_failed detail says first (the reply's detail is cut at 4096 characters) when the
 * clean-up could not retire attempt+1 somewhere: what those participants restored may still be there.
 */
function unretiredNote(unretired: readonly CleanupFailure[]): string {
  if (unretired.length === 0) return "";
  return `attempt+1 could not be retired at ${unretired.map(cleanupFailureNamed).join(", ")} before the clean-up's deadline, so what it restored may still be held there: retire attempt+1 there again before restarting those rollouts as attempt+2; `;
}

/** What a restore_failed detail says last when the clean-up's resume did not get through somewhere. */
function unresumedNote(unresumed: readonly CleanupFailure[]): string {
  if (unresumed.length === 0) return "";
  return `; the clean-up's resume did not get through at ${unresumed.map(cleanupFailureNamed).join(", ")}: a resume of this id sends it again there (else it resumes when its lease expires)`;
}

/** A cleaned-up restore's `restore_failed` detail: what failed, where attempt+1 was retired, what to do. */
function cleanedUpDetail(cleanup: CleanupResult, cause: string, installedMaybe: readonly ParticipantRef[]): string {
  const retired = installedMaybe.length
    ? `attempt+1 was retired where the restore may have installed it (${installedMaybe.map(refName).join(", ")})`
    : "every participant refused before installing anything, so nothing was retired";
  return `${unretiredNote(cleanup.unretired)}${cause}; ${retired}, and everyone resumed: restart those rollouts from input${unresumedNote(cleanup.unresumed)}`;
}

/** restore_failed's data: the cause's (its `failures`), and where attempt+1 could not be retired (`unretired`, as `failures` lists them). */
function cleanedUpData(cleanup: CleanupResult, data: Record<string, unknown> = {}): Record<string, unknown> {
  return cleanup.unretired.length ? { ...data, unretired: failureRefs(cleanup.unretired) } : data;
}

/** What a restore's clean-up could not do: retires that still failed where attempt+1 may be held, resumes that did not get through. */
interface CleanupResult {
  unretired: CleanupFailure[];
  unresumed: CleanupFailure[];
}

/**
 * A clean-up retire that another incarnation answered is not sent again: the process that restored
 * is gone, and what it restored went with it. One with no responders is (while the registry lists
 * it): a participant off NATS for a moment still holds attempt+1.
 */
function retireWorthRetrying(failure: Failure): boolean {
  return failure.code !== "stale_incarnation";
}

/**
 * A clean-up resume that did not get through (no responders, or no answer): the participant may be
 * off NATS for a moment, still parked in the restore, and no controller resumes a restore that
 * answered `restore_failed`. A refusal is its answer; a restarted process counts as resumed (send).
 */
function resumeWorthRetrying(failure: Failure): boolean {
  return failure.code === "unreachable" || failure.code === "outcome_unknown";
}

/**
 * The coordinator engine: the only sender of phase messages. It drives one checkpoint (or restore)
 * at a time through the protocol's stage orders, journals what a successor must know, and publishes.
 * Every refusal is a catalog code and leaves nothing changed.
 */
export class CheckpointEngine {
  private readonly lock = new AsyncLock();
  private open: OpenCheckpoint | undefined;
  /**
   * Checkpoints this coordinator resumed (closed), with the leadership term it closed each in;
   * resume of one of them is idempotent. Answered from memory only for this term's: one closed in
   * an earlier term may have been restored by a successor since, whose resume left a participant
   * holding it (see resume).
   */
  private readonly closed = new Map<string, number>();
  /**
   * Stop checkpoints this coordinator closed without a resume (participants stay parked for the
   * controller to stop them): a resume of one releases whoever still holds it, for a controller
   * that carries on after all.
   */
  private readonly stopped = new Set<string>();
  /**
   * Closed checkpoints whose resume failed at these participants (they resume when their lease
   * expires): a resume of the id sends it again to those that may still hold it, instead of
   * answering success for a participant still parked. Addressed as that resume was (the processes'
   * incarnations when the checkpoint opened): a process started since holds nothing of it, and a
   * resume would fence the id there. This term's only (leadershipLost).
   */
  private readonly unresumed = new Map<string, Unresumed>();
  /**
   * Restores that ended without their resume: their all-or-nothing clean-up ran here (attempt+1
   * retired, everyone resumed), or they were closed because no process held them any more. A
   * resume retried once such a restore closed answers `restore_failed` (this detail), not the
   * success a closed id gets: the controller must not continue rollouts nobody restored. Kept
   * while the id is among the closed ids remembered (REMEMBERED_CLOSED). Of an earlier term, the
   * journal's record of the id's last restore overrides it (learnRestoreOutcome).
   */
  private readonly restoreFailures = new Map<string, string>();
  /**
   * The `restore_failed` of the restores whose clean-up ran here (the last few): the same restore
   * sent again (its reply was lost) into the same processes gets it again, nothing sent. Those
   * processes fenced the id when the clean-up resumed them, so sending it again could only fail
   * there, and that refusal would belie the attempt+1 the first one retired.
   * Once the membership view shows a member restarted, the same request is a new restore.
   */
  private readonly failedRestores = new Map<string, FailedRestore>();
  /**
   * The `journal_unavailable` detail of the last few checkpoints aborted because their open entry
   * could not be journaled: a retry of that id (its reply lost) gets it again, not a bare
   * `stale_checkpoint` that would hide why the id is spent.
   */
  private readonly unjournaledPrepares = new Map<string, string>();
  /**
   * The refusal of the last few restores every participant refused (refuseRestore: nothing
   * installed, nothing cleaned up), with their scope: the same restore retried past its deadline
   * (its reply lost) gets that refusal again, not `deadline_exceeded` ("it never ran"), which would
   * hide that those processes refused it. One with a deadline ahead is sent again.
   */
  private readonly refusedRestores = new Map<string, { scope: EpisodeId[]; refusal: CheckpointError }>();
  /**
   * How the `checkpoint` op of a named id failed once that id was closed here (aborted: resumed
   * unpublished), for the last few ids: a retry (its reply lost) gets the failure again, why the
   * checkpoint was not taken, instead of a bare `stale_checkpoint` ("already resumed").
   */
  private readonly failedCheckpointOps = new Map<string, CheckpointError>();
  /** The last journal write per checkpoint id (a number from journalSeq): a removal scheduled by close() yields to any write made since. Dropped once the entry is removed or kept for good (entryKept, leadershipLost). */
  private readonly journalWrites = new Map<string, number>();
  private journalSeq = 0;
  /** Checkpoints (and restores) opened here: `opened_seq`, which orders them within this epoch whatever the wall clock does. */
  private openSeq = 0;
  /**
   * The journal-entry removals of restores whose resume this coordinator finished, while pending:
   * a resume retried meanwhile answers only once the entry is gone (see completionJournaled).
   */
  private readonly restoreRemovals = new Map<string, Promise<boolean>>();
  /**
   * Per id, the restore outcome record this term's last removal of its entry writes, set when that
   * removal is scheduled (absent: a plain one): until it lands the key still holds the entry, and a
   * restore opened meanwhile reads no record from the journal, yet takes that record's place
   * (outcomeBefore). One writer per term, so it stays what the key holds once removed.
   */
  private readonly restoreRecords = new Map<string, RestoreOutcome>();
  /**
   * The last successful reply per (id, op) of the most recent checkpoints, with the arguments it
   * answered: a controller retrying after a lost reply gets it again once the checkpoint closed.
   */
  private readonly replies = new Map<string, Map<string, { args: string; reply: unknown }>>();
  private readonly log: Logger;
  private recoveredFlag: boolean;
  /** Bumped when leadership is lost, so a recovery that straddles the loss does not count. */
  private leaderTerm = 0;
  /** Checkpoints being resumed unpublished whose commit decision was withdrawn (see close). */
  private readonly abandoned = new Set<string>();
  /** Phase messages sent and journal entries written, ever: tells whether a failed op had begun. */
  private effects = 0;
  /** The controller op holding the lock: a retry of it waits for its reply past the queue bound. */
  private runningOp: { name: string; id: string | undefined } | undefined;
  /** Retries waiting past their queue bound for the op they repeat (runningOp), by how each gives up: they do once another op runs. */
  private readonly overdue = new Map<() => void, { name: string; id: string | undefined }>();
  /**
   * Spells of failing retires and forgets outside any checkpoint, per op and per op and participant:
   * a controller sends them again every second while a Gym server is down (the collector does, for
   * up to --run-timeout-s), and each try at warn flooded the log. Checkpoint ops are not deduplicated:
   * each names a checkpoint of its own.
   */
  private readonly outsideSpells = new Map<string, FailureSpellLog>();
  /** This coordinator's last publication (`at` in s): within its epoch, later times come after it (epochTime). */
  private lastPublication: { epoch: number; at: number } | undefined;
  /** The participants of the checkpoint LATEST named when last read (read again when LATEST moves). */
  private latestMembers: { id: string; members: ParticipantRef[] } | undefined;

  constructor(private readonly options: CheckpointEngineOptions) {
    // `module`, not `component`: the daemon binds that, and pino would write a rebound key twice.
    this.log = options.logger.child({ module: "engine" });
    this.recoveredFlag = !options.requireRecovery;
  }

  /** Whether controller ops are served: recovery ran since leadership was (re)gained. */
  get recovered(): boolean {
    return this.recoveredFlag;
  }

  get openCheckpoint(): { checkpoint_id: string; phase: OpenPhase; epoch: number } | null {
    return this.open ? { checkpoint_id: this.open.id, phase: this.open.phase, epoch: this.open.epoch } : null;
  }

  // ---- controller ops --------------------------------------------------------------------

  prepare(request: CtlRequestOf<"prepare">): Promise<CtlReplyOf<"prepare">> {
    return this.op(
      "prepare",
      request.checkpoint_id,
      (ctx) => {
        this.deadlineCapped(request.deadline_ts);
        this.refuseUnjournaled(request.checkpoint_id);
        return this.doPrepare(request.checkpoint_id, this.deadline(request.deadline_ts), false, null, ctx);
      },
      request,
    );
  }

  commit(request: CtlRequestOf<"commit">): Promise<CtlReplyOf<"commit">> {
    const args = commitArgs(request.episode_ids, request.stop);
    return this.op("commit", request.checkpoint_id, async (ctx) => {
      this.deadlineCapped(request.deadline_ts);
      refuseCommitScope(request.episode_ids);
      const again = this.replayed<"commit">(request.checkpoint_id, "commit", args) ?? this.committedReply(request.checkpoint_id, request.episode_ids, request.stop);
      // A retry is answered whether its deadline_ts passed or not: a lost reply's retry carries a past one.
      if (again) return again;
      const reply = await this.doCommit(request.checkpoint_id, this.deadline(request.deadline_ts), request.episode_ids, request.stop, ctx);
      this.remember(request.checkpoint_id, "commit", args, reply);
      return reply;
    }, request);
  }

  publish(request: CtlRequestOf<"publish">): Promise<CtlReplyOf<"publish">> {
    return this.op("publish", request.checkpoint_id, async () => {
      const args = controllerStateArgs(request.controller_state ?? null); // refuses state nested too deep
      const again = this.replayed<"publish">(request.checkpoint_id, "publish", args);
      if (again) return again;
      // A reply kept here was checked above; without one (a predecessor published it, or later ids
      // pushed it out) checkpoint.json tells a retry from another controller state.
      const published = this.replies.get(request.checkpoint_id)?.has("publish") ? undefined : await this.publishedWith(request.checkpoint_id, request.controller_state);
      if (published) return this.publishReplyOf(published);
      const reply = await this.doPublish(request.checkpoint_id, request.controller_state);
      this.remember(request.checkpoint_id, "publish", args, reply);
      // stop: the controller stops after this checkpoint; participants stay parked (as in `checkpoint`).
      if (this.open?.id === request.checkpoint_id && this.open.stop) this.closeStopped(request.checkpoint_id);
      return reply;
    });
  }

  resume(request: CtlRequestOf<"resume">): Promise<CtlReplyOf<"resume">> {
    return this.op("resume", request.checkpoint_id, async (ctx) => {
      const id = request.checkpoint_id;
      const open = this.open;
      this.deadlineCapped(request.deadline_ts);
      // A retry of a resume that closed it sends nothing, so it is answered even if its deadline_ts
      // passed (a lost reply's retry carries a past one). Not a stop checkpoint's or a restore's that failed or still clears its entry.
      const closedThisTerm = this.closed.get(id) === this.leaderTerm;
      if (open?.id !== id && closedThisTerm && !this.stopped.has(id) && !this.restoreFailures.has(id) && !this.restoreRemovals.has(id) && !this.unresumed.has(id)) {
        return { checkpoint_id: id, participants: [] };
      }
      // Checked before anything is journaled: a refused resume changes nothing.
      const deadlineMs = this.deadline(request.deadline_ts);
      // Not open, nor closed in this term: a leader of another term may have settled a restore of it since.
      if (open?.id !== id && !closedThisTerm) await this.learnRestoreOutcome(id);
      // A controller abandoning a decided, unpublished checkpoint: withdrawn first (see abortDecided).
      if (open?.id === id && (open.phase === "committing" || open.phase === "committed")) {
        await this.withdrawDecision(open).catch((error: unknown) => {
          throw unjournaled(error, `checkpoint ${id}: its commit decision could not be withdrawn, so no resume was sent; the write may still have landed: send the resume again`);
        });
        this.abandoned.add(id);
      }
      if (open?.id === id && open.phase === "restored") return this.resumeRestored(open, deadlineMs, ctx);
      const failed = open?.id === id ? undefined : this.restoreFailures.get(id);
      if (failed) {
        // Its clean-up's resume failed somewhere: sent there again, as any failed resume's retry is
        // (else that participant stays parked until its lease); the answer stays restore_failed.
        // One closed in an earlier term (this term's list of where it failed is gone, see
        // leadershipLost): whoever the participants' status shows holding it.
        const parked = this.unresumed.get(id);
        const release = parked
          ? this.resumeAgain(id, parked.members, deadlineMs, ctx)
          : !open && this.closed.get(id) !== this.leaderTerm
            ? this.releaseHolders(id, deadlineMs, ctx, true)
            : undefined;
        if (release) {
          await release.catch((error: unknown) => {
            if (toCheckpointError(error).code === "not_leader") throw error;
            this.checkpointLog(id).warn({ err: error }, "restore_cleanup_resume_failed_again");
          });
        }
        throw new CheckpointError("restore_failed", failed);
      }
      const removal = open?.id === id ? undefined : this.restoreRemovals.get(id);
      if (removal) await this.completionJournaled(id, removal, deadlineMs);
      const unresumed = open?.id === id ? undefined : this.unresumed.get(id);
      if (unresumed) return this.resumeAgain(id, unresumed.members, deadlineMs, ctx);
      if (!open && !this.closed.has(id)) return this.releaseHolders(id, deadlineMs, ctx);
      // Parked by design, released now; once nobody holds it (the processes stopped), nothing to do.
      // Likewise one closed in an earlier term: a successor may have restored it since, and left a
      // participant holding it when that restore's resume failed there.
      if (!open && (this.stopped.has(id) || !closedThisTerm)) return this.releaseHolders(id, deadlineMs, ctx, true);
      // Its holders are released as an open checkpoint of their own: not beside another one.
      if (open && open.id !== id && this.stopped.has(id)) {
        throw new CheckpointError("checkpoint_conflict", `checkpoint ${open.id} is open (${open.phase}); resume it before releasing stop checkpoint ${id}`);
      }
      return this.doResume(id, deadlineMs, ctx);
    }, request);
  }

  /**
   * Aligns what is remembered of `id` (not open, not closed in this term) with how the last restore
   * of it settled, as the journal records it (see DecisionJournal.restoreOutcome): this memory is
   * of an earlier term at best, and a successor may have restored the id since, or cleaned a
   * restore of it up. Restored: a failure remembered here is an earlier restore's, forgotten (the
   * retry releases whoever still holds it, else succeeds). Cleaned up: answered restore_failed as
   * if the clean-up ran here. No record (none written, or compacted once retention deleted the checkpoint): what is remembered stands.
   * The journal unreadable: `outcome_unknown`, nothing changed, rather than guess either way.
   */
  private async learnRestoreOutcome(id: string): Promise<void> {
    const outcome = await this.journaledRestoreOutcome(id, `checkpoint ${id}`, "nothing was sent; retry the resume");
    if (outcome === undefined) return;
    this.checkpointLog(id).info({ outcome, remembered_failure: this.restoreFailures.has(id) }, "resume_restore_outcome_from_journal");
    // Closed (by whichever leader settled it): fenced for a prepare, and a retry asks its holders (releaseHolders).
    if (!this.closed.has(id)) this.closed.set(id, this.leaderTerm - 1);
    if (outcome === "restored") {
      this.restoreFailures.delete(id);
      this.failedRestores.delete(id);
      return;
    }
    if (!this.restoreFailures.has(id)) {
      this.restoreFailures.set(id, `the restore of checkpoint ${id} was cleaned up by another leader (attempt+1 retired where it may have been installed, everyone resumed): restart those rollouts from input`);
    }
  }

  /**
   * The journal's record of how the id's last restore settled (DecisionJournal.restoreOutcome).
   * Unreadable: `outcome_unknown` (`what`, then `then`), as the op changed nothing yet.
   */
  private journaledRestoreOutcome(id: string, what: string, then: string): Promise<RestoreOutcome | undefined> {
    return this.options.journal.restoreOutcome(id).catch((error: unknown) => {
      throw new CheckpointError(
        "outcome_unknown",
        `${what}: the decision journal could not be read to learn how a restore of it last settled, possibly by another leader (${error instanceof Error ? error.message : String(error)}); ${then}`,
        { cause: error },
      );
    });
  }

  /**
   * Resume of an id this coordinator has neither open nor closed: the participants whose status
   * shows them still holding it are resumed (only those, addressed to whichever process reports
   * it), as their lease would do much later. That is a checkpoint no journal entry or memory here
   * names, e.g. one a deposed leader's delayed prepare parked at a participant this leader's
   * recovery probe did not reach. None holds it: `not_found`, nothing sent. `closedBefore`: an id
   * closed here before (a stop checkpoint, or one closed in an earlier leadership term), which none
   * holding is the idempotent success.
   */
  private async releaseHolders(id: string, deadlineMs: number, ctx: Context | undefined, closedBefore = false): Promise<CtlReplyOf<"resume">> {
    const epoch = this.options.leadership.epoch();
    const members = await this.options.membership.list();
    const holders = holdersOf(members, await this.probeStatuses(members, epoch), id);
    // A stop checkpoint released once (or by its processes stopping) is an ordinary closed id after that.
    if (closedBefore) this.stopped.delete(id);
    // Closed here before: none holding it is the idempotent success; this term's from now on.
    if (holders.length === 0 && closedBefore) {
      this.closed.set(id, this.leaderTerm);
      return { checkpoint_id: id, participants: [] };
    }
    if (holders.length === 0) throw new CheckpointError("not_found", `checkpoint ${id} is not open on this coordinator, and no participant's status shows it held`);
    this.checkpointLog(id).warn({ holders: holders.map(refName) }, "resume_released_unknown_checkpoint");
    this.open = this.opening(id, "prepared", holders, { incarnations: new Map() });
    return this.doResume(id, deadlineMs, ctx);
  }

  /**
   * Extends every participant's lease (all at once), e.g. while the controller saves a large
   * state between prepare and publish (not during a publication: ops run one at a time); of a
   * prepare that stopped at a stage, the leases of the stages any prepare of it reached.
   */
  renew(request: CtlRequestOf<"renew">): Promise<CtlReplyOf<"renew">> {
    return this.op("renew", request.checkpoint_id, async (ctx) => {
      const open = this.requireOpen(request.checkpoint_id, "renew");
      const deadlineMs = this.deadline(request.deadline_ts);
      const epoch = open.epoch;
      const targets = open.reached ?? open.members;
      const outcomes = await inFanOutSpan("checkpoint.coordinate.renew.all", { [SPAN_ATTR.participants]: targets.length }, ctx, (c) =>
        runAll(targets, (m) => this.send(m, "renew", { checkpoint_id: open.id, deadline_ts: deadlineMs / 1000, epoch }, deadlineMs, epoch, c)),
      );
      const failures = failuresOf(outcomes);
      if (failures.length) throw combinedFailure("renew", failures);
      return {
        checkpoint_id: open.id,
        participants: outcomes.map((o) => ({ ...o.participant, lease_expires_at: o.ok ? o.reply.lease_expires_at : 0 })),
      };
    }, request);
  }

  checkpoint(request: CtlRequestOf<"checkpoint">): Promise<CtlReplyOf<"checkpoint">> {
    // An id is generated only for an op this coordinator serves: a refused one (a follower's
    // not_leader) must not name a checkpoint that never existed in its span and log line.
    // Closed before this op ran (published, resumed), a refusal is not how this op's checkpoint failed.
    let closedBefore = true;
    return this.op("checkpoint", request.checkpoint_id, async (ctx, identify) => {
      const id = request.checkpoint_id ?? newCheckpointId(this.options.clock.now());
      identify(id);
      closedBefore = this.closed.has(id);
      this.deadlineCapped(request.deadline_ts);
      refuseCommitScope(request.episode_ids);
      const args = canonicalJson([commitArgs(request.episode_ids, request.stop), controllerStateArgs(request.controller_state ?? null)]); // refuses state nested too deep
      const again = this.replayed<"checkpoint">(id, "checkpoint", args);
      if (again) return again;
      const failedBefore = this.failedCheckpointOps.get(id);
      if (failedBefore) throw new CheckpointError(failedBefore.code, `${failedBefore.message} (how an earlier request of this checkpoint op ended: the id is spent, checkpoint again with a fresh one)`, { data: failedBefore.data });
      this.refuseUnjournaled(id);
      // A generated id is fresh: only a named one can be a retry of a finished op (read from disk).
      const finished = request.checkpoint_id === undefined ? undefined : await this.publishedWith(id, request.controller_state, request);
      if (finished) return this.checkpointReplyOf(finished);
      const deadlineMs = this.deadline(request.deadline_ts);
      // A state file the publication would refuse is refused now, before the prepare parks anyone
      // and a commit burns the id (publish checks it again: it may change meanwhile).
      await this.options.writer.checkControllerState(id, request.controller_state);
      // Durations on the monotonic clock (the engine's clock is wall time, for deadlines).
      const t0 = performance.now();
      const prepared = await this.doPrepare(id, deadlineMs, true, request.controller_state, ctx, request.episode_ids);
      if (!prepared.prepared) {
        await this.abort(id, deadlineMs, ctx);
        // A refused participant's own detail too (a clock skew, a full disk): the code alone does not say what to fix.
        const refusal = (b: { kind: string; instance: string }) => prepared.participants.find((p) => p.kind === b.kind && p.instance === b.instance)?.error?.detail;
        const detail = prepared.blockers
          .map((b) => {
            const why = b.code ? refusal(b) : undefined;
            return `${b.kind}/${b.instance}: ${b.code ?? `${b.blocker_count} blocker(s)`}${why ? ` (${why.slice(0, 200)})` : ""}${b.blockers.length ? ` [${b.blockers.slice(0, 10).join(", ")}]` : ""}`;
          })
          .join("; ");
        throw new CheckpointError("prepare_incomplete", `checkpoint ${id} aborted: stage ${prepared.stopped_at?.join("+")} not prepared: ${detail}`, {
          data: { blockers: prepared.blockers },
        });
      }
      const t1 = performance.now();
      let commit: CommitResult;
      try {
        commit = await this.doCommit(id, deadlineMs, request.episode_ids, request.stop, ctx);
      } catch (error) {
        throw await this.abortDecided(id, deadlineMs, ctx, error);
      }
      const t2 = performance.now();
      // Publication and the resume run side by side; the reply waits for both. A participant that
      // resumed keeps its commit reply, so a successor finding the decision without checkpoint.json
      // still completes it (its re-driven commit is answered from those replies).
      const open = this.requireOpen(id, "checkpoint");
      const resuming = request.stop ? undefined : this.resumeStages(id, open.members, Math.max(deadlineMs, this.options.clock.now() + 1000), ctx);
      const publishing = this.doPublish(id, request.controller_state, false);
      let t3 = t2;
      let t4 = t2;
      const [publication, resumption] = await Promise.allSettled([
        publishing.finally(() => (t3 = performance.now())),
        resuming?.then(async (resumed) => {
          t4 = performance.now();
          await this.options.hooks?.afterResume?.(id);
          return resumed.failures;
        }),
      ]);
      if (publication.status === "rejected") throw await this.abortDecided(id, deadlineMs, ctx, publication.reason);
      // Only a lost leadership rejects the resume (its sends assert it): the op then reports
      // outcome_unknown, and the successor finishes the published checkpoint.
      if (resumption.status === "rejected") throw resumption.reason;
      // A participant that failed to resume (it resumes when its lease expires) is reported in the
      // reply, not as the op's failure, so the controller knows this checkpoint is its latest and a
      // retry gets the same reply. Closed only now: the journal entry may go once LATEST is durable.
      const resumeFailures = resumption.value ?? [];
      if (request.stop) this.closeStopped(id);
      else this.closeResumed(id, resumeFailures);
      // Retention after the resume: deleting old checkpoints need not keep everyone paused.
      const published = { ...publication.value, deleted: this.retainAfter(id, prepared.epoch) };
      return this.remember(id, "checkpoint", args, {
        checkpoint_id: id,
        epoch: prepared.epoch,
        checkpoint_dir: commit.checkpoint_dir,
        manifest_path: published.manifest_path,
        published_at: published.published_at,
        participants: commit.participants.length,
        restarts: prepared.restarts,
        deleted: published.deleted,
        resume_failures: failureRefs(resumeFailures),
        timings_ms: { prepare: ms(t1 - t0), commit: ms(t2 - t1), publish: ms(t3 - t2), resume: ms(t4 - t2) },
      });
    }, request, (error) => closedBefore || this.keepCheckpointFailure(request.checkpoint_id, error));
  }

  /** Keeps how a named checkpoint op failed once it closed its id here; not a failure whose outcome is unknown. */
  private keepCheckpointFailure(id: string | undefined, error: unknown): void {
    const refusal = toCheckpointError(error);
    if (id === undefined || !this.closed.has(id) || this.failedCheckpointOps.has(id)) return;
    // journal_unavailable has its own memory (unjournaledPrepares), answered to a prepare of the id too.
    if (refusal.code === "outcome_unknown" || refusal.code === "not_leader" || refusal.code === "journal_unavailable") return;
    this.failedCheckpointOps.set(id, refusal);
    keepNewest(this.failedCheckpointOps, REMEMBERED_CHECKPOINTS);
  }

  restore(request: CtlRequestOf<"restore">): Promise<CtlReplyOf<"restore">> {
    return this.op("restore", request.checkpoint_id, async (ctx, identify) => {
      // The controller APIs' schema refuses it; an in-process caller hands the request straight
      // here. Refused before anything: the participants would refuse it, and the clean-up's
      // resume would then fence the checkpoint's id at every one of them.
      const scopeIssue = restoreScopeIssue(request.episode_ids);
      if (scopeIssue) throw new CheckpointError("invalid_request", scopeIssue);
      this.deadlineCapped(request.deadline_ts);
      const id = request.checkpoint_id ?? (await this.options.catalog.latest());
      if (id) identify(id);
      const retryOf = (open: OpenCheckpoint | undefined) =>
        open?.restore && open.phase === "restored" && open.id === id && sameScope(open.scope, request.episode_ids) ? open.restore : undefined;
      const failedBefore = id ? this.failedRestoreRetried(id, request.episode_ids) : undefined;
      // A retry (its reply was lost, so its deadline_ts may be past) is not refused for its deadline.
      if (!retryOf(this.open) && !failedBefore) {
        const refused = id ? this.refusedRestores.get(id) : undefined;
        const past = request.deadline_ts !== undefined && request.deadline_ts * 1000 <= this.options.clock.now();
        if (refused && past && this.open?.id !== id && sameScope(refused.scope, request.episode_ids)) throw refused.refusal;
        this.deadline(request.deadline_ts);
      }
      // A restored checkpoint that no member holds any more (its controller abandoned it; its
      // processes restarted or resumed by their lease) is closed first: a retry's reply would be stale.
      if (this.open?.phase === "restored") await this.closeIfNobodyHolds(this.open);
      // A retry of the restore that is open gets that reply again.
      const again = retryOf(this.open);
      if (again) return again;
      // A retry of a restore that failed and was cleaned up here gets that failure again.
      if (failedBefore) throw failedBefore;
      // Not (or no longer) a retry: checked before anything is journaled or opened.
      const deadlineMs = this.deadline(request.deadline_ts);
      // A published checkpoint whose controller died before resuming it is exactly what the next
      // controller restores: closed here (once nothing can refuse the restore any more), without a
      // resume that would fence its id at the fresh participants the restore is for.
      const unresumed = this.open?.phase === "published" && this.open.id === id ? this.open : undefined;
      if (this.open && !unresumed) throw new CheckpointError("invalid_phase", `checkpoint ${this.open.id} is open (${this.open.phase}); resume it before a restore`);
      if (!id) throw new CheckpointError("not_found", "nothing was published yet (no LATEST)");
      // Aborted, its checkpoint.json not taken back yet (its entry kept for that, which a restore's
      // would overwrite): the catalog withholds it, so this refuses it not_found.
      const manifest = await this.committedManifests(id);
      const dir = this.options.catalog.dirFor(id);
      // Only fresh processes restore it: one still parked in it (its controller never resumed it, or
      // the resume failed there) would refuse, and the clean-up would resume it and fence the id,
      // leaving the controller nothing to resume.
      const parked = unresumed?.members ?? this.unresumed.get(id)?.members;
      if (parked) {
        const holders = holdersOf(parked, await this.probeStatuses(parked), id);
        if (holders.length) {
          throw new CheckpointError("invalid_phase", `checkpoint ${id} is published but ${holders.map(refName).join(", ")} still hold it parked; resume it before a restore`);
        }
      }
      // Nothing restored while an entry of the registry cannot be read: a participant of another
      // protocol version (or announcing a corrupt value) would be left out or sent what it cannot read.
      const unreadable = (await this.options.membership.unreadable?.()) ?? [];
      if (unreadable.length) throw unreadableRefusal(`restore of checkpoint ${id} refused, nothing sent`, unreadable);
      const members = manifest.participants.map((p) => ({ kind: p.kind, instance: p.instance }));
      const open = this.opening(id, "restoring", members, { dir, scope: request.episode_ids, manifestDigests: manifestDigestsOf(manifest) });
      // The largest entries this restore may journal: its clean-up's (where to retire), and the
      // restored and resuming ones (the restorers' incarnations, which only the replies name:
      // counted at their longest). A restored entry refused at write time would leave the restore
      // unjournaled and its resume refused, everyone parked until their lease.
      this.assertJournalable({ ...open, retireAt: members }, "restore_cleanup");
      const longest = "x".repeat(MAX_INCARNATION_CHARS);
      this.assertJournalable({ ...open, incarnations: new Map(members.map((m) => [memberKey(m.kind, m.instance), longest])) }, "resuming");
      assertCleanupRetireFits(open, deadlineMs);
      // This term's, read before the journal is: that read may outlive it.
      const epoch = open.epoch;
      const term = this.leaderTerm;
      // The entry of a published checkpoint nobody resumed holds the key: no record there.
      if (!unresumed) {
        const journaled = await this.journaledRestoreOutcome(id, `restore of checkpoint ${id}`, "nothing was sent; send the restore again");
        // Lost meanwhile: the read is an earlier term's, and the record map (and the id) the next one's.
        if (term !== this.leaderTerm) throw new CheckpointError("not_leader", `leadership was lost while the restore of checkpoint ${id} read the decision journal; nothing was sent`);
        // A removal of the id's last restore's entry scheduled here may not have landed yet: its record.
        open.outcomeBefore = journaled ?? this.restoreRecords.get(id);
      }
      // Closed before the restore's write, so its entry's removal yields to that write.
      const wasClosed = this.closed.get(id);
      if (unresumed && this.open === unresumed) this.close(id);
      await this.journal(open, "restoring").catch((error: unknown) => {
        // Nothing was sent, so nothing changes here: an unresumed checkpoint is open again. The write
        // may still land, and a successor would re-drive that restore (its clean-up retiring attempt+1,
        // maybe where the controller went on), so what was journaled is put back, best effort: the
        // unresumed one's entry, else none (removed once LATEST is durable, as close() would). Either
        // way the controller's retry converges: its write comes after (one key's writes run in call
        // order; a removal yields to a newer write), and if none is put back, a successor's re-drive
        // answers that retry.
        const refusal = unjournaled(error, `restore of checkpoint ${id}: its journal entry could not be written, so nothing was sent; the write may still have landed: send the restore again`);
        if (term !== this.leaderTerm) throw refusal; // deposed: the entry is the successor's now
        const writes = this.journalWrites.get(id);
        if (unresumed) {
          this.open = unresumed;
          if (wasClosed === undefined) this.closed.delete(id);
          else this.closed.set(id, wasClosed);
          this.journal(unresumed, "decided").catch((cause: unknown) => this.checkpointLog(id).warn({ err: cause }, "restore_unjournaled_entry_not_put_back"));
        } else {
          this.removalRecords(id, open.outcomeBefore);
          void this.options.writer.durable().then(() => this.removeEntry(id, writes, term, open.outcomeBefore), () => this.entryKept(id, writes));
        }
        throw refusal;
      });
      // Leadership lost during the write dropped the open state: do not put back a stale restore.
      this.options.leadership.assert(epoch);
      this.open = open;
      const putBack = this.forgetRestoreHistory(id);
      return this.driveRestore(open, deadlineMs, ctx, undefined, { putBack, term });
    }, request);
  }

  retire(request: CtlRequestOf<"retire">): Promise<CtlReplyOf<"retire">> {
    return this.op("retire", request.checkpoint_id, async (ctx, identify) => {
      const all = await this.callersBeforeCallees("retire", request.checkpoint_id, request.deadline_ts, { episode_ids: request.episode_ids }, ctx, identify);
      return { participants: all.map((o) => ({ ...o.participant, retired: o.ok ? o.reply.retired : [] })) };
    }, request);
  }

  forget(request: CtlRequestOf<"forget">): Promise<CtlReplyOf<"forget">> {
    return this.op("forget", request.checkpoint_id, async (ctx, identify) => {
      const all = await this.callersBeforeCallees("forget", request.checkpoint_id, request.deadline_ts, { rollout_ids: request.rollout_ids }, ctx, identify);
      return { participants: all.map((o) => ({ ...o.participant, forgotten: o.ok ? o.reply.forgotten : [] })) };
    }, request);
  }

  /** Retire and forget: environment, then agent, then model and resources; stop at the first failing stage. */
  private async callersBeforeCallees<O extends "retire" | "forget">(
    op: O,
    requestedId: string | undefined,
    deadlineTs: number | undefined,
    body: Omit<RequestOf<O>, "checkpoint_id" | "deadline_ts" | "epoch">,
    ctx: Context | undefined,
    identify: (id: string) => void,
  ): Promise<Outcome<O>[]> {
    const { checkpointId, members: own, epoch, deadlineMs, restored } = await this.outsideCheckpoint(op, requestedId, deadlineTs);
    if (checkpointId !== undefined) identify(checkpointId);
    const id = checkpointId ?? outsideCheckpointId(op);
    // In a restored checkpoint the members are its own; a registered participant it lacks (one
    // that joined after that checkpoint, idle here) may still serve the retired attempt, so the
    // fence must reach it too, as a retire outside any checkpoint reaches every registered one.
    const members = restored ? this.withRegistered(own, await this.options.membership.list()) : own;
    // An expected participant the registry does not list (a lapsed heartbeat: it may still run and
    // serve the retired attempt), or one whose entry this coordinator cannot read, fails its stage,
    // as in prepare: the fence must reach it.
    const absent = new Map(allAbsent(await this.absentFrom(members, op)).map((f) => [f.participant, f]));
    const { results, stoppedAt } = await runStages(
      RETIRE_STAGES,
      [...members, ...absent.keys()],
      (m, c) =>
        absent.has(m)
          ? Promise.resolve(absent.get(m)!)
          : this.send(m, op, { checkpoint_id: id, deadline_ts: deadlineMs / 1000, epoch, ...body } as RequestOf<O>, deadlineMs, epoch, c),
      { spanName: `checkpoint.coordinate.${op}.stage`, parent: ctx, proceed: (o) => failuresOf(o).length === 0 },
    );
    const all = results.flatMap((r) => r.outcomes);
    if (stoppedAt) throw combinedFailure(op, failuresOf(all));
    return all;
  }

  /** `members`, then the registered participants not among them. */
  private withRegistered(members: readonly ParticipantRef[], registered: readonly ParticipantRef[]): ParticipantRef[] {
    const known = new Set(members.map((m) => memberKey(m.kind, m.instance)));
    return [...members, ...registered.filter((m) => !known.has(memberKey(m.kind, m.instance)))];
  }

  /**
   * The leadership as `status` reports it: ready only once recovery ran too, as ops are served.
   * Until then `checkpoint` is null while a predecessor's may be journaled (recovery opens it again),
   * and a reader acting on "nothing open" (the collector's start) must not take it for the leader's word.
   */
  private servingState(): Omit<ReturnType<Leadership["state"]>, "serving"> {
    // `serving` is the /readyz header's (HEADER_COORDINATOR_SERVED), no field of the status reply.
    const { serving: _serving, ...state } = this.options.leadership.state();
    return { ...state, ready: state.ready && this.recovered };
  }

  /** Status of every registered participant (one directed status request each); no lock needed. */
  async status(): Promise<CtlReplyOf<"status">> {
    const registered = await this.options.membership.list();
    const known = new Map(registered.map((m) => [memberKey(m.kind, m.instance), m]));
    for (const m of this.open?.members ?? []) known.set(memberKey(m.kind, m.instance), m);
    // Expected members the registry lacks, and members whose entry this coordinator cannot read, are
    // listed as prepare would report them, not probed: a process alive without a (readable)
    // heartbeat would look fine here yet block the next checkpoint.
    const absent = allAbsent(await this.absentFrom([...known.values()]));
    const members = [...known.values()].sort(byMemberKey);
    const outcomes = [...(await this.probeStatuses(members)), ...absent].sort((a, b) => byMemberKey(a.participant, b.participant));
    return {
      deployment: this.options.deployment,
      coordinator: this.servingState(),
      checkpoint: this.openCheckpoint,
      participants: outcomes.map((o) =>
        o.ok
          ? {
              ...o.participant,
              reachable: true,
              phase: o.reply.phase,
              checkpoint_id: o.reply.checkpoint_id,
              lease_expires_at: o.reply.lease_expires_at,
              epoch: o.reply.epoch,
              blockers: o.reply.report.blockers,
              blocker_count: o.reply.report.blocker_count,
              error: null,
            }
          : {
              ...o.participant,
              reachable: o.code !== "unreachable" && o.code !== "outcome_unknown",
              phase: null,
              checkpoint_id: null,
              lease_expires_at: null,
              epoch: null,
              blockers: [],
              blocker_count: 0,
              error: { code: o.code, detail: o.detail },
            },
      ),
    };
  }

  /**
   * The published checkpoints, LATEST and the damaged ones, as `gym-ckpt ls --json` lists them
   * (catalogListing): a damaged LATEST or checkpoint is no refusal. Served after recovery only (see
   * assertCatalogKnown).
   */
  async list(): Promise<CtlReplyOf<"list">> {
    this.assertCatalogKnown();
    return catalogListing(this.options.catalog);
  }

  async get(request: CtlRequestOf<"get">): Promise<CtlReplyOf<"get">> {
    this.assertCatalogKnown();
    const manifest = await this.options.catalog.get(request.checkpoint_id);
    // A damaged LATEST names no checkpoint (as `list` answers it), and refuses none asked for by id.
    return { latest: (await latestOrNone(this.options.catalog)) === request.checkpoint_id, manifest };
  }

  // ---- recovery (new leader) ---------------------------------------------------------------

  /**
   * Completes what a previous leader journaled (presumed abort): a decided commit is re-driven and,
   * for the convenience op, published and resumed; a published checkpoint is resumed here only if
   * the convenience op published it (see recoverPublished); a restore is sent again (driveRestore:
   * restored everywhere, or cleaned up all or nothing) unless it is restored and nobody holds it
   * any more (closed); a restore's clean-up is finished; anything else is resumed. Runs once
   * leadership is ready, before any controller op.
   *
   * Controller ops are served only once it resolves. One entry that fails is logged and stays
   * journaled (the controller can still resume it); but if the journal or the membership cannot be
   * read at all, it rejects and the gate stays shut: serving then would leave a predecessor's
   * decided commit unfinished while new checkpoints open beside it. The daemon retries.
   */
  recover(): Promise<{ checkpoint_id: string; action: string }[]> {
    const term = this.leaderTerm;
    return this.lock.run(async () => {
      const done = await this.recoverAll(term);
      if (term === this.leaderTerm) this.recoveredFlag = true;
      return done;
    });
  }

  /**
   * Recovers for leadership term `term` only. A term that ended before it ran (it waited for the
   * lock) or while it runs (the lease lost, and maybe won again) stops it, returning what it did:
   * the term now current runs its own recovery, which would otherwise find what this one left open
   * in its place and close it as a leftover, its journal entry removed while it stays open.
   */
  private async recoverAll(term: number): Promise<{ checkpoint_id: string; action: string }[]> {
    const done: { checkpoint_id: string; action: string }[] = [];
    const ended = (): boolean => {
      if (term === this.leaderTerm) return false;
      // Opened in a later term by this recovery: that term's recovery finds it in the journal.
      this.open = undefined;
      this.log.warn({ recovered: done }, "recovery_term_ended_stopped");
      return true;
    };
    if (ended()) return done;
    // Oldest first: a checkpoint opens only once the one before it closed, so an older entry that
    // recovery would leave open is a leftover whose removal a crash cut short — the newer one wins.
    // By the order they opened in (compareOpenedOrder), not `epoch` (a successor's rewrite raises it) or
    // `prepared_at` (a wall clock stepped back would put a newer decision first and close it).
    const entries = [...(await this.options.journal.list())].sort(compareOpenedOrder);
    if (ended()) return done;
    // Carries this leader's epoch: every participant that answers refuses a deposed leader's
    // delayed ops from now on (before any controller op is served), and one that admitted such a
    // prepare already shows it here, so resumeOrphans releases it.
    const statuses = await this.probeStatuses(undefined, this.options.leadership.epoch());
    for (const [index, entry] of entries.entries()) {
      if (ended()) return done;
      const previous = this.open;
      if (previous) {
        this.log.info({ checkpoint_id: previous.id, newer: entry.checkpoint_id }, "recovery_superseded_entry_closed");
        this.close(previous.id);
        done.push({ checkpoint_id: previous.id, action: "superseded_closed" });
      }
      const newer = entries[index + 1];
      if (newer && entry.state === "decided" && !this.options.catalog.has(entry.checkpoint_id)) {
        // Closed by its leader unpublished (a publication failed and the decision's withdrawal too),
        // since the newer one opened after it: completing it would publish a checkpoint its
        // controller was told had failed, and its retention would delete the newer decision's files.
        // Closed without a message: its participants have moved on to the newer one.
        this.log.warn({ checkpoint_id: entry.checkpoint_id, newer: newer.checkpoint_id }, "recovery_superseded_decision_closed");
        this.close(entry.checkpoint_id);
        done.push({ checkpoint_id: entry.checkpoint_id, action: "superseded_closed" });
        continue;
      }
      const action = await this.recoverOne(entry, statuses).catch((error: unknown) => {
        // A decision that could not be journaled again ends the recovery, rejected: see recoverOne.
        if (isDecisionNotJournaled(error)) throw error;
        this.log.error({ checkpoint_id: entry.checkpoint_id, err: error }, "recovery_failed");
        return "failed";
      });
      done.push({ checkpoint_id: entry.checkpoint_id, action });
    }
    if (ended()) return done;
    done.push(...(await this.resumeOrphans(new Set(entries.map((e) => e.checkpoint_id)), statuses)));
    return done;
  }

  /**
   * The highest coordinator epoch a registered participant reports having seen, from the statuses
   * that answer within `withinMs` (0 when none does). A status without an epoch raises nothing there.
   * Bounded by `withinMs` whatever the request timeouts: a new leader asks it while its lease runs.
   * An epoch no later one can pass (2^53 - 1) is left out, logged: as the floor, the lease would
   * ignore it whole, the other participants' epochs and the published ones with it.
   */
  async highestEpochSeen(withinMs: number): Promise<number> {
    const members = await this.options.membership.list();
    let highest = 0;
    const deadlineMs = this.options.clock.now() + withinMs;
    const probes = runAll(members, async (m) => {
      const outcome = await this.options.client.call(m, "status", {}, deadlineMs);
      if (!outcome.ok) return;
      if (isPassableEpoch(outcome.reply.epoch)) highest = Math.max(highest, outcome.reply.epoch);
      else this.log.error({ kind: m.kind, instance: m.instance, epoch: outcome.reply.epoch }, "participant_epoch_out_of_range_ignored");
    });
    let cancel: (() => void) | undefined;
    await Promise.race([probes, new Promise<void>((resolve) => (cancel = this.options.clock.setTimer(resolve, withinMs)))]);
    cancel?.();
    return highest;
  }

  /**
   * One directed status request to each member (default: every registered participant). With
   * `epoch` (a leader's), each participant that answers raises its epoch fence to it.
   */
  private async probeStatuses(members?: readonly ParticipantRef[], epoch?: number): Promise<Outcome<"status">[]> {
    const targets = members ?? (await this.options.membership.list());
    const deadlineMs = this.options.clock.now() + (this.options.statusTimeoutMs ?? 2000);
    return runAll(targets, (m) => this.options.client.call(m, "status", epoch === undefined ? {} : { epoch }, deadlineMs));
  }

  /**
   * Participants still preparing or prepared for a checkpoint no journal entry names: a predecessor
   * crashed while its first prepare stage and the entry's write were both in flight. Presumed
   * abort, found by asking every registered participant for its status.
   */
  private async resumeOrphans(journaled: ReadonlySet<string>, outcomes: Outcome<"status">[]): Promise<{ checkpoint_id: string; action: string }[]> {
    const orphans = new Map<string, ParticipantRef[]>();
    for (const o of outcomes) {
      if (!o.ok || (o.reply.phase !== "preparing" && o.reply.phase !== "prepared") || o.reply.checkpoint_id === null) continue;
      if (journaled.has(o.reply.checkpoint_id)) continue;
      orphans.set(o.reply.checkpoint_id, [...(orphans.get(o.reply.checkpoint_id) ?? []), o.participant]);
    }
    const done: { checkpoint_id: string; action: string }[] = [];
    // A journaled checkpoint recovery left open (published, restored, committed) stays the open one,
    // unless leadership was lost meanwhile (a deposed leader holds nothing open).
    const kept = this.open;
    const term = this.leaderTerm;
    for (const [id, prepared] of orphans) {
      this.log.info({ checkpoint_id: id, participants: prepared.length }, "recovery_resume_unjournaled");
      // Addressed to whichever process reported it prepared, not to the view's (possibly older) incarnation.
      this.open = this.opening(id, "prepared", prepared, { incarnations: new Map() });
      const action = await this.doResume(id, this.options.clock.now() + this.options.defaultTimeoutMs, undefined).then(
        () => "resumed_unjournaled",
        (error: unknown) => {
          this.log.warn({ checkpoint_id: id, err: error }, "recovery_resume_failed");
          return "failed";
        },
      );
      done.push({ checkpoint_id: id, action });
    }
    this.open = term === this.leaderTerm ? kept : undefined;
    return done;
  }

  private async recoverOne(entry: JournalEntry, statuses: Outcome<"status">[]): Promise<string> {
    const log = this.log.child({ checkpoint_id: entry.checkpoint_id, previous_epoch: entry.epoch });
    const deadlineMs = this.options.clock.now() + this.options.defaultTimeoutMs;
    const journaledRestorers = entry.incarnations && new Map(Object.entries(entry.incarnations));
    // Where the predecessor's view lagged behind a restorer, that view: still shown here, it is lagging too.
    const journaledView = journaledRestorers && new Map([...journaledRestorers, ...Object.entries(entry.viewed ?? {})]);
    const open = this.opening(entry.checkpoint_id, "prepared", entry.participants, {
      // The restorers of a restored checkpoint are journaled; a predecessor's view otherwise is not.
      incarnations: new Map(journaledRestorers ?? []),
      // What counts as "the view at open" for them: the restorers, not this leader's view now, which
      // already shows any process that replaced one (a restart that must not pass for a lagging view).
      ...(journaledView && { viewed: journaledView }),
      preparedAt: entry.prepared_at,
      openedEpoch: entry.opened_epoch ?? entry.epoch,
      openedSeq: entry.opened_seq,
      restarts: entry.restarts,
      dir: entry.checkpoint_dir,
      scope: entry.scope,
      stop: entry.stop,
      autoPublish: entry.auto_publish,
      controllerState: entry.controller_state,
    });
    this.open = open;
    if (entry.state === "restoring" || entry.state === "restored" || entry.state === "resuming") {
      // A restore of the id sent since what this coordinator remembers of it (a clean-up it ran in an
      // earlier term, the successor's restore journaled after it): that memory must not answer this
      // one's resume or restore retried (restore_failed for a restore that succeeded). Its outcome will.
      this.forgetRestoreHistory(open.id);
    }
    switch (entry.state) {
      case "decided": {
        if (this.options.catalog.has(open.id)) return this.recoverPublished(open, statuses, log);
        // Its leader made a real directory; a link there now is not this checkpoint's: completing it
        // would commit and publish through the link. Presumed abort instead.
        if (this.options.catalog.linked(open.id)) {
          log.warn({ state: entry.state }, "recovery_checkpoint_dir_linked_resumed");
          const linked = new CheckpointError("invalid_checkpoint_state", `checkpoint directory ${this.options.catalog.dirFor(open.id)} is a symbolic link, not a checkpoint this root holds`);
          await this.abortDecided(open.id, deadlineMs, undefined, linked);
          return "commit_failed_resumed";
        }
        const newer = await this.publishedSince(entry);
        if (newer) {
          // A decision whose withdrawal failed while its controller moved on: completing it now
          // would move LATEST back from the newer checkpoint. Presumed abort instead.
          log.warn({ state: entry.state, latest: newer }, "recovery_decision_overtaken_resumed");
          await this.abortDecided(open.id, deadlineMs, undefined, new Error(`checkpoint ${newer} was published since`));
          return "decision_overtaken_resumed";
        }
        log.info({ state: entry.state }, "recovery_redrive_commit");
        try {
          await this.doCommit(open.id, deadlineMs, entry.scope, entry.stop, undefined);
        } catch (error) {
          if (isDecisionNotJournaled(error)) {
            // Its rewrite as decided failed (a KV timeout; or refused: the entry changed since the
            // listing): no commit left here, and the journal still holds the decision (its
            // predecessor's, or this rewrite landed). Not aborted for it, which would resume
            // participants the predecessor's commit reached and drop the decision: recovery stops
            // here, the checkpoint not open, the gate shut, and runs again (the daemon retries while
            // this term lasts), re-reading the entry as when the journal cannot be listed.
            log.warn({ err: error }, "recovery_decision_not_journaled_retrying");
            if (this.open === open) this.open = undefined;
            throw error;
          }
          log.warn({ err: error }, "recovery_commit_failed_resuming");
          await this.abortDecided(open.id, deadlineMs, undefined, error);
          return "commit_failed_resumed";
        }
        if (!entry.auto_publish) return "committed";
        try {
          await this.doPublish(open.id, entry.controller_state);
        } catch (error) {
          // e.g. its controller-state file is missing: left open, it would refuse every new checkpoint
          log.warn({ err: error }, "recovery_publish_failed_resuming");
          await this.abortDecided(open.id, deadlineMs, undefined, error);
          return "publish_failed_resumed";
        }
        if (entry.stop) {
          this.closeStopped(open.id);
          this.rememberRecovered(open, []);
          return "committed_published_stopped";
        }
        await this.finishRecovered(open, deadlineMs, log);
        return "committed_published_resumed";
      }
      case "restoring":
      case "restored": {
        if (entry.state === "restored" && !mayHold(open.members, statuses, open.id)) {
          // It outlived its processes (restarted, or resumed by their lease): its controller no longer
          // has it to resume, and a re-sent restore would install it into processes that never took
          // part, parked for nobody, while the open restore refused every new checkpoint.
          log.info({ state: entry.state }, "recovery_restored_released_closed");
          this.closeReleasedRestore(open);
          return "restored_closed";
        }
        // Re-driven like a decided commit: its controller saw outcome_unknown, and a retry with the
        // same id and scope gets the reply (a clean-up here would fence the id everywhere instead).
        log.info({ state: entry.state }, "recovery_redrive_restore");
        try {
          // Checked, and pinned in the messages, as a restore does before its first send (no
          // checkpoint.json: nothing to check against or pin, the participants' answers decide). A storage refusal (EIO)
          // leaves the entry for a later recovery; a manifest that no longer matches (replaced since
          // the predecessor's send, which may have installed it anywhere) is the restore's failure:
          // cleaned up at every member.
          let unrestorable: CheckpointError | undefined;
          // A checkpoint directory replaced by a link since: `get` refuses it, so the restore fails
          // here rather than install whatever the link leads to.
          if (this.options.catalog.has(open.id) || this.options.catalog.linked(open.id)) {
            try {
              open.manifestDigests = manifestDigestsOf(await this.committedManifests(open.id));
            } catch (error) {
              if (isUnreadableStorage(error)) throw error;
              unrestorable = toCheckpointError(error);
            }
          }
          if (unrestorable) await this.failRestore(open, open.members, unrestorable, deadlineMs, undefined);
          if (await this.driveRestore(open, deadlineMs, undefined, entry.state)) return "restored";
        } catch (error) {
          if (!(error instanceof CheckpointError && error.code === "restore_failed")) throw error;
          log.warn({ err: error }, "recovery_restore_failed");
          return "retired_resumed";
        }
        return this.open === open ? "restored_partly_resumed" : "restored_resumed_closed";
      }
      case "resuming":
        // Its controller's resume was under way: finished, addressed to the journaled restorers
        // (idempotent where it arrived). One restarted since lost what it restored: the restore's
        // clean-up then runs instead, and the controller's retried resume answers restore_failed.
        log.info({ state: entry.state }, "recovery_resume_restored");
        open.phase = "restored";
        try {
          await this.resumeRestored(open, deadlineMs, undefined);
          return "resumed";
        } catch (error) {
          if (error instanceof CheckpointError && error.code === "restore_failed") {
            log.warn({ err: error }, "recovery_restored_participant_restarted");
            return "retired_resumed";
          }
          log.warn({ err: error }, "recovery_resume_failed"); // closed; the failed ones resume by their lease
          return "resumed";
        }
      case "restore_cleanup": {
        // Finished, never re-driven: participants keep their restore reply past a retire, so a
        // re-sent restore would answer restored where attempt+1 was already retired.
        log.info({ state: entry.state }, "recovery_restore_cleanup");
        if (entry.retire_at) open.retireAt = entry.retire_at;
        const cleanup = await this.restoreCleanup(open, deadlineMs, undefined);
        // Its controller (told outcome_unknown) retries the restore: while these processes serve
        // (the clean-up fenced the id there) it gets this failure, as from the leader that failed it.
        const cause = `the restore of checkpoint ${open.id} failed under a previous leader (its cause went with it)`;
        this.rememberFailedRestore(open, cleanedUpDetail(cleanup, cause, open.retireAt ?? open.members), cleanedUpData(cleanup));
        return "retired_resumed";
      }
      case "open":
      case "published":
        if (entry.state === "published" && this.options.catalog.has(open.id)) return this.recoverPublished(open, statuses, log);
        // Undecided, yet a checkpoint.json (which only a decision's publication writes): an aborted
        // publication's its leader could not take back. Taken back before its close removes the
        // entry, or it would be listed, restorable and counted by retention as published; failing
        // that, the close keeps the entry (untakenBackOf) and this writer's next retain retries.
        if (entry.state === "open" && (this.options.catalog.has(open.id) || this.options.writer.untakenBackOf(open.id))) {
          const takenBack = await this.options.writer.takeBackAborted(open.id);
          log.warn({ state: entry.state, taken_back: takenBack }, "recovery_aborted_checkpoint_json_taken_back");
        }
        log.info({ state: entry.state }, "recovery_resume");
        await this.doResume(open.id, deadlineMs, undefined).catch((error: unknown) => log.warn({ err: error }, "recovery_resume_failed"));
        return "resumed";
      default: {
        const unknownState: never = entry.state;
        throw new Error(`unknown journal state ${String(unknownState)}`);
      }
    }
  }

  /**
   * The checkpoint LATEST names (naming nothing readable: the newest that reads back), if it was
   * published after `entry`'s decision.
   * Ordered as repairLatest orders publications: by epoch, and only within one epoch (one leader's
   * clock) by time, never across coordinators' clocks.
   */
  private async publishedSince(entry: JournalEntry): Promise<string | undefined> {
    const after = (m: { epoch: number; published_at: number }) => m.epoch > entry.epoch || (m.epoch === entry.epoch && m.published_at * 1000 > entry.updated_at);
    try {
      const latest = await this.options.catalog.latest();
      if (latest === entry.checkpoint_id) return undefined;
      if (latest !== null) return after(await this.options.catalog.get(latest)) ? latest : undefined;
    } catch (error) {
      // A LATEST the storage refuses to read may name a newer checkpoint: completing this decision
      // could move LATEST back from it. The entry stays for a later recovery.
      if (isUnreadableStorage(error)) throw error;
    }
    // LATEST names nothing readable (missing, damaged, or naming a damaged checkpoint.json): the
    // newest checkpoint that reads back stands in for it, as in repairLatest.
    const newest = this.options.catalog.newest();
    return newest && newest.checkpoint_id !== entry.checkpoint_id && after(newest) ? newest.checkpoint_id : undefined;
  }

  /**
   * A published checkpoint whose resume a predecessor may not have sent: handled as the in-memory
   * path handles it after publish, never with a resume of its own (it would reach processes started
   * since and fence the id there, so restoring LATEST would be refused).
   */
  private async recoverPublished(open: OpenCheckpoint, statuses: Outcome<"status">[], log: Logger): Promise<string> {
    const epoch = this.options.leadership.epoch();
    const latest = await this.options.writer.repairLatest(open.id, () => this.options.leadership.assert(epoch)).catch((error: unknown) => {
      log.error({ err: error }, "recovery_latest_repair_failed"); // LATEST left as it is
      // Refused by the storage (EIO, ENOSPC): so is the entry, for a later recovery to repair LATEST
      // (as a decision whose LATEST cannot be read). Closed now, nothing would, and its controller's
      // retry would be told it published while LATEST may name an older checkpoint. (A damaged
      // checkpoint.json of its own is no storage failure: no recovery could point LATEST at it.)
      if (isStorageFailure(error)) throw error;
      // Deposed meanwhile: LATEST is the successor's to keep, and so is this entry.
      if (error instanceof CheckpointError && error.code === "not_leader") throw error;
      return "failed" as const;
    });
    open.phase = "published";
    if (latest === "superseded") {
      // A newer checkpoint was published since, so this one was closed: its entry outlived the close.
      log.info({ state: "published" }, "recovery_published_superseded");
      this.close(open.id);
      return "superseded_closed";
    }
    if (latest === "repaired") log.warn({ state: "published" }, "recovery_latest_repaired");
    // What its commit and publish answered, for a controller retrying them. The publish's arguments
    // are not known here: a retry is checked against checkpoint.json instead (publishedWith).
    const manifest = await this.options.catalog.get(open.id).catch(() => undefined);
    if (manifest) {
      open.commit = this.remember(open.id, "commit", commitArgs(open.scope, open.stop), {
        checkpoint_id: open.id,
        epoch: manifest.epoch,
        checkpoint_dir: this.options.catalog.dirFor(open.id),
        participants: manifest.participants,
      });
      open.publish = this.publishReplyOf(manifest);
    }
    // stop: the controller stopped after it; participants stay parked by design.
    if (open.stop) {
      this.closeStopped(open.id);
      if (open.autoPublish) this.rememberRecovered(open, []);
      return "published_stopped";
    }
    const holders = holdersOf(open.members, statuses, open.id);
    if (open.autoPublish) {
      // The convenience op resumes as it publishes, and its controller saw it fail: finish
      // it here. Only the processes still holding it are resumed: a fresh one would fence the id
      // that a later restore of LATEST needs (an unreachable one resumes when its lease expires,
      // so it does not keep the checkpoint open either).
      if (holders.length === 0) {
        log.info({ state: "published" }, "recovery_published_closed");
        this.close(open.id);
        this.rememberRecovered(open, []);
        return "published_closed";
      }
      log.info({ state: "published", holders: holders.length }, "recovery_published_resumed");
      open.members = holders;
      await this.finishRecovered(open, this.options.clock.now() + this.options.defaultTimeoutMs, log);
      return "published_resumed";
    }
    // Nobody holds it any more (resumed, resumed by lease, or restarted): nothing is left to resume.
    if (!mayHold(open.members, statuses, open.id)) {
      log.info({ state: "published" }, "recovery_published_closed");
      this.close(open.id);
      return "published_closed";
    }
    // Left open: the controller's resume closes it, or the next controller's restore does.
    log.info({ state: "published" }, "recovery_published_open");
    return "published_open";
  }

  /**
   * A published or restored checkpoint left open for its controller's resume (after publish or
   * restore, or recovered so) is closed once every member's status shows it no longer holds it
   * (resumed by its lease, or restarted): otherwise it would refuse every new checkpoint until
   * someone resumed it by hand. A restored one whose controller abandoned it (it took a failover's
   * outcome_unknown as a failure) would also be re-driven by every later leader.
   */
  private async closeIfNobodyHolds(open: OpenCheckpoint): Promise<void> {
    if (open.phase !== "published" && open.phase !== "restored") return;
    const statuses = await this.probeStatuses(open.members);
    if (mayHold(open.members, statuses, open.id) || this.open !== open) return;
    this.checkpointLog(open.id).info({ phase: open.phase }, `${open.phase}_checkpoint_released_closed`);
    if (open.phase === "restored") this.closeReleasedRestore(open);
    else this.close(open.id);
  }

  /**
   * Closes a restore no process holds any more (restarted, or resumed by its lease) without a
   * resume: what it restored may be gone, so its controller's resume answers `restore_failed`.
   */
  private closeReleasedRestore(open: OpenCheckpoint): void {
    this.restoreFailures.set(
      open.id,
      `the restore of checkpoint ${open.id} was released before its resume (its processes restarted, or resumed when their lease expired), so what it restored may be gone: retire attempt+1 and restart those rollouts from input`,
    );
    this.close(open.id);
  }

  // ---- phases ---------------------------------------------------------------------------

  private async doPrepare(
    id: string,
    deadlineMs: number,
    autoPublish: boolean,
    controllerState: ControllerStateInput | null,
    ctx: Context | undefined,
    /** The scope the convenience op will commit: checked with the open entry, before anything is sent. */
    commitScope: EpisodeId[] | null = null,
  ): Promise<CtlReplyOf<"prepare">> {
    if (this.open && this.open.id !== id) await this.closeIfNobodyHolds(this.open);
    let open = this.open;
    let journaled: Promise<void> | undefined;
    if (open && open.id !== id) throw new CheckpointError("checkpoint_conflict", `checkpoint ${open.id} is open (${open.phase}); resume it first`);
    if (open && open.phase !== "preparing" && open.phase !== "prepared") {
      throw new CheckpointError("invalid_phase", `checkpoint ${id} is ${open.phase}; prepare is not allowed`);
    }
    // The convenience op on an id a fine-grained prepare opened would go on without publishing it
    // (journaled so) or its controller state: that checkpoint is the controller's to finish.
    if (open && autoPublish && !open.autoPublish) {
      throw new CheckpointError("checkpoint_conflict", `checkpoint ${id} was opened by a prepare of its own; finish it with commit, publish and resume (or resume it), or checkpoint under a fresh id`);
    }
    if (!open) {
      this.refuseUnjournaled(id); // checked by both callers before their deadline too; kept here, where the id opens
      if (this.closed.has(id)) throw new CheckpointError("stale_checkpoint", `checkpoint ${id} was already resumed; use a fresh id`);
      if (this.options.catalog.published(id)) {
        const what = this.options.catalog.untakenBack.has(id) ? "was aborted (its checkpoint.json not taken back yet)" : "is already published";
        throw new CheckpointError("stale_checkpoint", `checkpoint ${id} ${what}; use a fresh id`);
      }
      const members = await this.options.membership.list();
      // An unreadable entry naming no participant fits no stage: refused before anything is opened or sent.
      const unreadable = (await this.options.membership.unreadable?.()) ?? [];
      const keyless = unreadable.filter((u) => u.participant === undefined);
      if (keyless.length) throw unreadableRefusal(`prepare of checkpoint ${id} refused, nothing sent`, keyless);
      this.refuseNoParticipants(members, unreadable);
      await this.warnLatestMembersMissing(members);
      open = this.opening(id, "preparing", members, { autoPublish, controllerState });
      this.assertJournalable({ ...open, dir: this.options.catalog.dirFor(id), scope: commitScope }, "open");
      await this.clearLeftover(id, members, open.epoch);
      // Leadership lost during its probe dropped the open state: do not open it on a deposed leader.
      this.options.leadership.assert(open.epoch);
      // Journaled while the first stage's prepares are in flight and acknowledged before the second
      // stage: a successor resumes whatever this one opened, from this entry or, if it crashed before
      // the entry was acknowledged, from the first stage's status (recover → resumeOrphans).
      journaled = this.journal(open, "open");
      journaled.catch(() => undefined); // observed below
      this.open = open;
      // LATEST's next content is this id: its temp file is written and fsynced while the stages run
      // (renamed only at publication; dropped when the checkpoint closes unpublished).
      this.options.writer.stage(id);
    }
    const epoch = open.epoch;
    // Expected members the registry did not list when the checkpoint opened, and members whose entry
    // this coordinator cannot read: never sent anything (they are not members of it, so resume skips
    // them too), reported in their stage instead. An unreadable entry naming no participant refused
    // the prepare that opened the checkpoint; one written since is left out, as a member joining is.
    const members = open.members;
    const { unreadable, unregistered } = await this.absentFrom(members);
    const absent = new Map(allAbsent({ unreadable, unregistered }).map((f) => [f.participant, f]));
    if (unregistered.length) this.checkpointLog(id).warn({ missing: unregistered.map((f) => refName(f.participant)) }, "expected_participants_missing");
    if (unreadable.length) this.checkpointLog(id).warn({ unreadable: unreadable.map((f) => f.detail) }, "unreadable_members_not_prepared");
    let staged: StagedRun<Outcome<"prepare">>;
    try {
      staged = await runStages(
        PREPARE_STAGES,
        [...members, ...absent.keys()],
        async (m, c) =>
          absent.has(m)
            ? absent.get(m)!
            : this.send(m, "prepare", { checkpoint_id: id, deadline_ts: deadlineMs / 1000, epoch }, deadlineMs, epoch, c),
        { spanName: "checkpoint.coordinate.prepare.stage", parent: ctx, proceed: (o) => o.every((x) => x.ok && x.reply.phase === "prepared"), gate: journaled },
      );
      await journaled;
    } catch (error) {
      const journalError = journaled && (await journaled.then(() => undefined, (e: unknown) => e ?? new Error("journal write failed")));
      if (!journalError) throw error;
      // No entry, no checkpoint: nobody stays prepared for one a successor could not find.
      const unresumed = await this.abort(id, deadlineMs, ctx);
      // A catalog refusal (a fenced write's not_leader) keeps its code; anything else is JetStream's
      // (KV unavailable, a timeout, a full or misconfigured bucket, permissions), not a gym-ckpt bug.
      if (journalError instanceof CheckpointError) throw journalError;
      throw this.rememberUnjournaled(id, journalError, unresumed);
    }
    // Leadership lost during the stages shows as a `not_leader` stage result; what is left of this
    // prepare is the successor's to abort or complete, so the op must not look like an answer.
    this.options.leadership.assert(epoch);
    const { results, stoppedAt } = staged;
    const outcomes = results.flatMap((r) => r.outcomes);
    const participants = outcomes.map((o) =>
      o.ok
        ? { ...o.participant, ok: true, phase: o.reply.phase, report: o.reply.report, error: null }
        : { ...o.participant, ok: false, phase: null, report: null, error: { code: o.code, detail: o.detail } },
    );
    const blockers = outcomes
      .filter((o) => !o.ok || o.reply.phase !== "prepared")
      .map((o) =>
        o.ok
          ? { ...o.participant, blockers: o.reply.report.blockers, blocker_count: o.reply.report.blocker_count, code: null }
          : { ...o.participant, blockers: [], blocker_count: 0, code: o.code },
      );
    const restarts = [...new Set(outcomes.flatMap((o) => (o.ok ? o.reply.report.restarts : [])))].sort();
    const prepared = stoppedAt === null;
    // The latest prepare decides: one re-driven after it succeeded that stops at a stage (a member
    // unreachable or restarted since) leaves the checkpoint not prepared, so commit is refused.
    open.phase = prepared ? "prepared" : "preparing";
    // What an earlier prepare of this checkpoint reached stays reached (parked, its lease running)
    // when a re-driven one stops at an earlier stage: renew must keep reaching it.
    const sent = new Set(outcomes.map((o) => o.participant));
    const before = open.reached;
    open.reached = members.filter((m) => sent.has(m) || (before?.includes(m) ?? false));
    if (prepared) {
      open.restarts = restarts;
      open.scopeRequiredBy = outcomes.filter((o) => o.ok && o.reply.report.scope_required).map((o) => refName(o.participant));
    }
    if (prepared) this.checkpointLog(id).info({ prepared, stopped_at: stoppedAt, blockers: 0 }, "prepared");
    else {
      // A checkpoint not taken: a warning naming who held it up (the first few; the reply has all),
      // once per checkpoint id.
      const blockedBy = blockers.slice(0, 10).map((b) => `${b.kind}/${b.instance}: ${b.code ?? `${b.blocker_count} blocker(s)`}`);
      this.checkpointLog(id)[open.incompleteWarned ? "info" : "warn"]({ prepared, stopped_at: stoppedAt, blockers: blockers.length, blocked_by: blockedBy }, "prepare_incomplete");
      open.incompleteWarned = true;
    }
    return { checkpoint_id: id, epoch, prepared, stopped_at: stoppedAt ? [...stoppedAt] : null, participants, blockers, restarts };
  }

  /**
   * A fresh id's directory must be free of participants' files: an attempt at this id aborted
   * before a restart (the coordinator's own aborts refuse the id as stale) left the participants'
   * directory, whose create-only manifests would refuse every commit once everyone is parked; it
   * is taken away (the rest of the directory, e.g. a controller's state file, stays). Something
   * there that is not a directory refuses the id before anything is journaled or sent. So does a
   * member still holding that attempt (an abort that never reached it; it would answer the new
   * prepare and commit from its reply cache, naming the files taken away): resume the id first.
   */
  private async clearLeftover(id: string, members: readonly ParticipantRef[], epoch: number): Promise<void> {
    const leftover = this.options.catalog.leftover(id);
    if (leftover === "not_a_directory") {
      throw new CheckpointError("checkpoint_conflict", `${this.options.catalog.dirFor(id)} exists and is not a directory: use another checkpoint id`);
    }
    if (leftover === "participants_not_a_directory") {
      // Refused before anything is sent: a commit through it fails everywhere after the decision, and the abort's resume fences the id.
      throw new CheckpointError("checkpoint_conflict", `${join(this.options.catalog.dirFor(id), PARTICIPANTS_DIR)} exists and is not a directory: move it, or use another checkpoint id`);
    }
    if (leftover === "participants") {
      const holders = holdersOf(members, await this.probeStatuses(members), id);
      if (holders.length) {
        throw new CheckpointError("checkpoint_conflict", `${holders.map(refName).join(", ")} still hold an earlier attempt at checkpoint ${id}; resume ${id} first (nothing was sent)`);
      }
      // A deposed leader moves nothing away: its successor may be committing this id into it.
      this.options.leadership.assert(epoch);
      trashCheckpointDir(this.options.catalog.root, id, PARTICIPANTS_DIR);
      this.checkpointLog(id).warn("earlier_attempt_participant_files_removed");
    }
  }

  /**
   * An op with nobody to send to is `not_found`, unless participants are expected or have entries
   * this coordinator cannot read: then each one fails its stage as `unreachable` (absentFrom), as
   * when others are registered.
   */
  private refuseNoParticipants(members: readonly ParticipantRef[], unreadable: readonly UnreadableMember[] = []): void {
    if (members.length === 0 && !this.options.expected?.length && unreadable.length === 0) throw new CheckpointError("not_found", "no participants in the membership registry");
  }

  /**
   * The participants an op over `members` must report as failures of their stage (`unreachable`),
   * never sending them anything: one whose membership entry this coordinator cannot read (another
   * protocol version's announcement, a corrupt value: left out, its rollouts would miss the
   * checkpoint, or the fence, unnoticed), then an expected participant (config
   * `expected_participants`) the registry does not list. Each group sorted by member key.
   *
   * An unreadable entry whose key names no participant fits no stage: with `op`, that op is refused
   * here (`unreachable`), before anything is sent; without, it is left out (`status` cannot list it).
   */
  private async absentFrom(members: readonly ParticipantRef[], op?: string): Promise<Absent> {
    const unreadable = (await this.options.membership.unreadable?.()) ?? [];
    const keyless = unreadable.filter((u) => u.participant === undefined);
    if (op !== undefined && keyless.length) throw unreadableRefusal(`${op} refused, nothing sent`, keyless);
    const present = new Set(members.map((m) => memberKey(m.kind, m.instance)));
    const absent: Absent = { unreadable: [], unregistered: [] };
    for (const u of unreadable) {
      if (!u.participant || present.has(u.key)) continue; // one already a member is addressed as such
      present.add(u.key);
      absent.unreadable.push({ ok: false, participant: u.participant, code: "unreachable", detail: `${refName(u.participant)} cannot be addressed: ${u.reason}` });
    }
    for (const e of this.options.expected ?? []) {
      if (!present.has(memberKey(e.kind, e.instance))) absent.unregistered.push(notRegistered(e));
    }
    absent.unreadable.sort((a, b) => byMemberKey(a.participant, b.participant));
    absent.unregistered.sort((a, b) => byMemberKey(a.participant, b.participant));
    return absent;
  }

  /**
   * Warns about each participant of the last published checkpoint the registry does not list: a
   * restore from the next checkpoint would go on without its state (a lapsed heartbeat, or a
   * process gone for good). Never fails the checkpoint; `expected_participants` makes it a blocker.
   */
  private async warnLatestMembersMissing(members: readonly ParticipantRef[]): Promise<void> {
    try {
      // Read once per leadership term; after that, this leader's own publications keep it (no file
      // reads on the prepare's path: they cost about a millisecond per checkpoint on a busy machine).
      if (!this.latestMembers) {
        const latest = await this.options.catalog.latest();
        if (latest === null) return;
        const manifest = await this.options.catalog.get(latest);
        this.latestMembers = { id: latest, members: manifest.participants.map((p) => ({ kind: p.kind, instance: p.instance })) };
      }
      const { id: latest, members: latestMembers } = this.latestMembers;
      const present = new Set(members.map((m) => memberKey(m.kind, m.instance)));
      const absent = latestMembers.filter((p) => !present.has(memberKey(p.kind, p.instance)));
      if (absent.length) this.log.warn({ latest, absent: absent.map(refName) }, "latest_participants_missing");
    } catch (error) {
      this.log.warn({ err: error }, "latest_participants_unread");
    }
  }

  private async doCommit(
    id: string,
    deadlineMs: number,
    scope: EpisodeId[] | null,
    stop: boolean,
    ctx: Context | undefined,
  ): Promise<CommitResult> {
    const open = this.requireOpen(id, "commit");
    if (open.phase === "committed" || open.phase === "published") {
      const again = this.committedReply(id, scope, stop);
      if (again) return again;
      throw new CheckpointError("checkpoint_conflict", `checkpoint ${id} was committed with another scope or stop flag`);
    }
    if (open.phase !== "prepared" && open.phase !== "committing") {
      throw new CheckpointError("invalid_phase", `checkpoint ${id} is ${open.phase}; commit needs every participant prepared`);
    }
    if (open.phase === "committing" && (!sameScope(open.scope, scope) || open.stop !== stop)) {
      throw new CheckpointError("checkpoint_conflict", `checkpoint ${id} is being committed with another scope or stop flag`);
    }
    if (scope && open.phase === "prepared") {
      // Refused here, before the decision is journaled: a corrected scope can still be committed.
      const restarts = new Set(open.restarts);
      const inScope = scope.map(captureKey).filter((key) => restarts.has(key));
      if (inScope.length) throw new CheckpointError("restart_in_scope", `the scope names restarts prepare reported: ${inScope.slice(0, 10).join(", ")}`);
    }
    if (scope === null && open.phase === "prepared" && open.scopeRequiredBy?.length) {
      // Refused here, before the decision: sent to all at once, it would fail at these participants
      // after the others committed, and a decided checkpoint can only be completed or aborted.
      throw new CheckpointError(
        "invalid_request",
        `${open.scopeRequiredBy.join(", ")} export only the commit's episode_ids and refuse a null scope: name the episodes you continue in episode_ids (the CLI's --episodes; [] or --episodes \"\" when none continues) (refused before the commit decision: nothing was committed)`,
      );
    }
    const dir = this.options.catalog.dirFor(id);
    const epoch = open.epoch;
    if (open.phase === "prepared") this.assertJournalable({ ...open, dir, scope, stop }, "decided");
    // The directory exists before any commit leaves (made during the prepare; a successor's re-drive
    // makes it here): a participant that does not see it (its checkpoint storage not mounted there)
    // refuses the commit rather than write to its local disk. Failing before a first decision, it
    // leaves the checkpoint prepared.
    await this.options.writer.checkpointDirectory(id, { decided: open.phase !== "prepared" });
    await this.options.hooks?.beforeDecision?.(id);
    if (open.phase === "prepared") {
      open.dir = dir;
      open.scope = scope;
      open.stop = stop;
      // The decision is durable before any commit leaves: a successor completes it.
      await this.journal(open, "decided").catch((error: unknown) => {
        const failure = unjournaled(error, `checkpoint ${id}: the commit decision could not be journaled, so no commit was sent; the write may still have landed, for a successor to re-drive`);
        if (typeof failure === "object" && failure !== null) DECISION_NOT_JOURNALED.add(failure);
        throw failure;
      });
      open.phase = "committing";
    }
    await this.options.hooks?.afterDecision?.(id);
    const outcomes = await inFanOutSpan("checkpoint.coordinate.commit.all", { [SPAN_ATTR.participants]: open.members.length }, ctx, (c) =>
      runAll(open.members, (m) =>
        this.send(m, "commit", { checkpoint_id: id, deadline_ts: deadlineMs / 1000, epoch, checkpoint_dir: dir, episode_ids: scope, stop }, deadlineMs, epoch, c),
      ),
    );
    const failures = failuresOf(outcomes);
    if (failures.length) throw combinedFailure("commit", failures);
    const participants: ParticipantEntry[] = await Promise.all(
      outcomes.map(async (o) => {
        if (!o.ok) throw new Error("unreachable");
        const entry = {
          kind: o.participant.kind,
          instance: o.participant.instance,
          manifest_path: o.reply.manifest_path,
          manifest_sha256: o.reply.manifest_sha256,
          records_sha256: o.reply.manifest.records_sha256,
          record_count: o.reply.manifest.record_count,
          extras: o.reply.extras,
        };
        // A reply too long to list its episodes names their count and digest: read from the records it committed.
        const episodeIds = o.reply.episode_ids ?? (await committedEpisodeIds(dir, id, { ...entry, episode_count: o.reply.episode_count, episode_ids_sha256: o.reply.episode_ids_sha256 }));
        return { ...entry, episode_ids: episodeIds };
      }),
    );
    open.phase = "committed";
    open.commit = { checkpoint_id: id, epoch, checkpoint_dir: dir, participants };
    return open.commit;
  }

  /** Publishes; retention runs here unless the caller runs it later (`retainNow` false). */
  private async doPublish(id: string, controllerState: ControllerStateInput | null, retainNow = true): Promise<CtlReplyOf<"publish">> {
    const open = this.requireOpen(id, "publish");
    if (open.phase === "published" && open.publish) return open.publish;
    if (open.phase !== "committed" || !open.commit) {
      throw new CheckpointError("invalid_phase", `checkpoint ${id} is ${open.phase}; publish needs every commit to have succeeded`);
    }
    this.options.leadership.assert(open.epoch);
    await this.options.hooks?.beforePublication?.(id);
    const publishedAt = this.epochTime(open.epoch) / 1000;
    const result = await this.options.writer.publish({
      checkpointId: id,
      epoch: open.epoch,
      preparedAt: open.preparedAt,
      publishedAt,
      stop: open.stop,
      scope: open.scope,
      restarts: open.restarts,
      participants: open.commit.participants,
      controllerState: controllerState ?? open.controllerState,
      // Again after the awaits above: a demoted leader must not write checkpoint.json or LATEST.
      beforeWrite: () => this.options.leadership.assert(open.epoch),
    });
    open.phase = "published";
    this.lastPublication = { epoch: open.epoch, at: publishedAt };
    // LATEST names it now: the missing-members warning needs no read of it (or of LATEST) later.
    this.latestMembers = { id, members: open.commit.participants.map((p) => ({ kind: p.kind, instance: p.instance })) };
    const deleted = retainNow ? this.retainAfter(id, open.epoch) : [];
    open.publish = { checkpoint_id: id, manifest_path: result.manifestPath, published_at: publishedAt, deleted };
    // No journal write here: recovery of a decided entry finds checkpoint.json and treats it as published.
    coordinatorTelemetry().published.add(1);
    this.checkpointLog(id).info({ deleted }, "published");
    return open.publish;
  }

  private async doResume(id: string, deadlineMs: number, ctx: Context | undefined): Promise<CtlReplyOf<"resume">> {
    const { reply, failures } = await this.resumeEveryone(id, deadlineMs, ctx);
    if (failures.length) throw combinedFailure("resume", failures);
    return reply;
  }

  /**
   * The resume of a restored checkpoint. A member that restarted since it restored (the membership
   * view shows it, or it refuses the resume as another incarnation) lost its restored state while
   * the others kept theirs: continuing would mix a restored rollout with one started from input.
   * So the restore's all-or-nothing clean-up runs instead (journaled `restore_cleanup` first, so a
   * successor finishes it rather than re-drive the restore), and the reply is `restore_failed`.
   */
  private async resumeRestored(open: OpenCheckpoint, deadlineMs: number, ctx: Context | undefined): Promise<CtlReplyOf<"resume">> {
    for (const m of open.members) {
      const restorer = open.incarnations.get(memberKey(m.kind, m.instance));
      const restarted = restorer === undefined ? null : this.restartedSince(m, open.id, restorer);
      if (restarted) (open.lostRestorers ??= new Map()).set(refName(m), restarted);
    }
    if (!open.lostRestorers) {
      // Journaled first: a successor finding everyone idle then knows this resume released them
      // (a success to finish), not a restart or a lease that lost what they restored.
      await this.journal(open, "resuming").catch((error: unknown) => {
        throw unjournaled(error, `checkpoint ${open.id}: its resume could not be journaled, so no resume was sent; the write may still have landed: send the resume again`);
      });
      // None known yet; the resume itself may still meet one the view does not show (resumedElsewhere).
      const { reply, failures } = await this.resumeStages(open.id, open.members, deadlineMs, ctx);
      if (!open.lostRestorers) {
        // Its entry never repairs LATEST: removed without waiting for LATEST's fsync.
        const removal = this.closeResumed(open.id, failures, false);
        this.restoreRemovals.set(open.id, removal);
        void removal.then((removed) => {
          if (removed && this.restoreRemovals.get(open.id) === removal) this.restoreRemovals.delete(open.id);
        });
        // Failed at some too, it answers only once the entry is gone: told the checkpoint closed
        // anyway, its controller continues the restored rollouts, which a successor finding the
        // entry `resuming` would retire once a restorer's restart shows (one that did not answer).
        await this.completionJournaled(open.id, removal, deadlineMs);
        if (failures.length) throw combinedFailure("resume", failures);
        return reply;
      }
    }
    const lost: Map<string, string> = open.lostRestorers;
    this.checkpointLog(open.id).warn({ lost: [...lost.keys()] }, "restored_participant_restarted");
    // Not written (a KV timeout): nothing more is sent, the checkpoint stays restored (a retry, or a
    // successor finding `resuming` or `restore_cleanup`, cleans up), as for the `resuming` write above.
    await this.journal(open, "restore_cleanup").catch((error: unknown) => {
      throw unjournaled(error, `checkpoint ${open.id}: ${[...lost.keys()].join(", ")} restarted since the restore, and the clean-up that resume runs could not be journaled, so it was not run; the write may still have landed: send the resume again`);
    });
    const cleanup = await this.restoreCleanup(open, deadlineMs, ctx);
    throw new CheckpointError(
      "restore_failed",
      `${unretiredNote(cleanup.unretired)}${[...lost.keys()].join(", ")} restarted since the restore and lost what it restored (${[...lost.values()].join("; ")}), so attempt+1 was retired everywhere and everyone resumed: restart those rollouts from input${unresumedNote(cleanup.unresumed)}`,
      { data: cleanedUpData(cleanup) },
    );
  }

  /** Resume stage by stage in reverse, past failures, which it returns; the checkpoint is closed either way. */
  private async resumeEveryone(id: string, deadlineMs: number, ctx: Context | undefined): Promise<{ reply: CtlReplyOf<"resume">; failures: Failure[] }> {
    const open = this.open;
    if (!open || open.id !== id) {
      if (this.closed.has(id)) return { reply: { checkpoint_id: id, participants: [] }, failures: [] };
      if (open) throw new CheckpointError("checkpoint_conflict", `checkpoint ${open.id} is open, not ${id}`);
      throw new CheckpointError("not_found", `checkpoint ${id} is not open on this coordinator`);
    }
    const resumed = await this.resumeStages(id, open.members, deadlineMs, ctx);
    // Closed even when some failed: an unreachable participant resumes when its lease expires.
    this.closeResumed(id, resumed.failures);
    return resumed;
  }

  /** The resume requests of `open`, stage by stage in reverse (the stages left at once past the deadline), past failures; leaves it open. */
  private async resumeStages(id: string, members: readonly ParticipantRef[], deadlineMs: number, ctx: Context | undefined): Promise<{ reply: CtlReplyOf<"resume">; failures: Failure[] }> {
    const epoch = this.options.leadership.epoch();
    const { results } = await runStages(
      RESUME_STAGES,
      members,
      (m, c) => this.send(m, "resume", { checkpoint_id: id, deadline_ts: deadlineMs / 1000, epoch }, deadlineMs, epoch, c),
      // Past its deadline, the stages left go at once: each stalled one in turn would add the
      // request slack, and a failed prepare's abort answer its controller after it stopped waiting.
      { spanName: "checkpoint.coordinate.resume.stage", parent: ctx, allAtOnce: () => this.options.clock.now() >= deadlineMs },
    );
    const outcomes = results.flatMap((r) => r.outcomes);
    return {
      reply: { checkpoint_id: id, participants: outcomes.map((o) => ({ ...o.participant, idempotent: o.ok ? o.reply.idempotent : false })) },
      failures: failuresOf(outcomes),
    };
  }

  /**
   * The wall clock (ms), but after this coordinator's last publication in `epoch`: within one epoch
   * that time alone orders checkpoints (retention, LATEST's repair) and tells a successor's recovery
   * whether LATEST's publication overtook a journaled decision, so a clock stepped back (NTP, a
   * resumed VM) must neither rank a new LATEST below its predecessors (retention would delete the
   * checkpoint before it) nor make a fresh decision look older than LATEST (presumed abort).
   * `published_at` (s) and a journal entry's `updated_at` (ms) both come from here.
   */
  private epochTime(epoch: number): number {
    const now = this.options.clock.now();
    const last = this.lastPublication;
    return last && last.epoch === epoch && now <= last.at * 1000 ? last.at * 1000 + 1 : now;
  }

  /** Whether this coordinator still leads in `epoch` (a deposed one deletes nothing: its successor may use the files). */
  private stillLeading(epoch: number): boolean {
    try {
      this.options.leadership.assert(epoch);
      return true;
    } catch {
      return false;
    }
  }

  /** Retention after a publication whose reply must not fail for it (the checkpoint is published). */
  private retainAfter(id: string, epoch: number): string[] {
    try {
      // A deposed leader deletes nothing: its successor may have published since.
      this.options.leadership.assert(epoch);
      return this.options.writer.retain(id, () => this.stillLeading(epoch));
    } catch (error) {
      this.log.warn({ checkpoint_id: id, err: error }, "retention_failed");
      return [];
    }
  }

  /** Resumes a recovered convenience op's checkpoint (past failures, logged) and keeps its reply. */
  private async finishRecovered(open: OpenCheckpoint, deadlineMs: number, log: Logger): Promise<void> {
    const { failures } = await this.resumeEveryone(open.id, deadlineMs, undefined);
    if (failures.length) log.warn({ err: combinedFailure("resume", failures) }, "recovery_resume_failed");
    this.rememberRecovered(open, failures);
  }

  /**
   * The reply a predecessor's convenience op would have given, kept for its controller's retry
   * (that controller saw the op fail when the predecessor died). Timings are not known: zero.
   */
  private rememberRecovered(open: OpenCheckpoint, failures: Failure[]): void {
    if (!open.commit || !open.publish) return;
    this.remember(open.id, "checkpoint", canonicalJson([commitArgs(open.scope, open.stop), controllerStateArgs(open.controllerState)]), {
      checkpoint_id: open.id,
      epoch: open.commit.epoch,
      checkpoint_dir: open.commit.checkpoint_dir,
      manifest_path: open.publish.manifest_path,
      published_at: open.publish.published_at,
      participants: open.commit.participants.length,
      restarts: open.restarts,
      deleted: open.publish.deleted,
      resume_failures: failureRefs(failures),
      timings_ms: { prepare: 0, commit: 0, publish: 0, resume: 0 },
    });
  }

  /**
   * Aborts a checkpoint after a failed commit or publication and returns the error its controller
   * gets. The decision is withdrawn first (the entry goes back to `open`): participants answer a
   * re-driven commit from the reply they keep after resuming, so a successor finding `decided`
   * would publish a checkpoint its controller was told had failed. If it cannot be withdrawn, a
   * successor may still complete it, which the controller learns as `outcome_unknown`.
   */
  private async abortDecided(id: string, deadlineMs: number, ctx: Context | undefined, error: unknown): Promise<unknown> {
    const open = this.open;
    const withdrawn =
      open?.id !== id ||
      open.phase === "prepared" || // refused before the decision: there is nothing to withdraw
      (await this.withdrawDecision(open).then(
        () => true,
        (cause: unknown) => {
          this.log.warn({ checkpoint_id: id, err: cause }, "abort_decision_not_withdrawn");
          return false;
        },
      ));
    // Nothing journaled completes it any more: its directory goes when the abort closes it.
    if (withdrawn && open?.id === id) this.abandoned.add(id);
    await this.abort(id, deadlineMs, ctx);
    if (withdrawn) return error;
    const detail = error instanceof Error ? error.message : String(error);
    return new CheckpointError("outcome_unknown", `checkpoint ${id} failed after its commit was decided (${detail}) and the decision could not be withdrawn, so a successor may still complete it; retry with the same checkpoint id once a leader serves`, { cause: error });
  }

  /** Journals `open` as undecided again (presumed abort: recovery resumes it rather than commit it). */
  private withdrawDecision(open: OpenCheckpoint): Promise<void> {
    return this.journal(open, "open");
  }

  /**
   * Best-effort abort after a failed step of the convenience op; the original error is what the
   * caller sees. Resolves to the resume's failure (those participants resume when their lease
   * expires), undefined when everyone resumed.
   */
  private async abort(id: string, deadlineMs: number, ctx: Context | undefined): Promise<CheckpointError | undefined> {
    try {
      // A few seconds for the resume, past a prepare that may have run request_slack_ms past its
      // deadline: the controller's reply must leave within the clients' 10 s slack. A participant
      // that does not answer by then (stalled) resumes when its lease expires.
      await this.doResume(id, Math.max(deadlineMs, this.options.clock.now() + ABORT_RESUME_MS), ctx);
      return undefined;
    } catch (error) {
      this.log.warn({ checkpoint_id: id, err: error }, "abort_resume_incomplete");
      return toCheckpointError(error);
    }
  }

  /**
   * A retry of a checkpoint aborted because its open entry could not be written (its reply lost)
   * gets that `journal_unavailable` again, answered from memory before its deadline_ts is looked at:
   * the client retries once deadline_ts + slack is over, and `deadline_exceeded` ("it never ran")
   * would hide that the id is spent.
   */
  private refuseUnjournaled(id: string): void {
    const detail = this.open?.id === id ? undefined : this.unjournaledPrepares.get(id);
    if (detail !== undefined) throw new CheckpointError("journal_unavailable", detail);
  }

  /**
   * The `journal_unavailable` of a checkpoint aborted because its open entry could not be written,
   * kept for a retry of its id (the last REMEMBERED_CHECKPOINTS). Had the write landed after all,
   * the entry only says `open`: a successor resumes it (presumed abort), which changes nothing now.
   */
  private rememberUnjournaled(id: string, cause: unknown, unresumed: CheckpointError | undefined): CheckpointError {
    const why = cause instanceof Error ? cause.message : String(cause);
    const resumed = unresumed
      ? `every participant was resumed but those the resume failed at, which resume when their lease expires (${unresumed.message.slice(0, 500)})`
      : "every participant was resumed";
    const detail = `checkpoint ${id}: its open entry could not be written to the decision journal in JetStream KV (${why}), so it was aborted: nothing was committed and ${resumed}; check JetStream, then checkpoint again with a new id`;
    this.unjournaledPrepares.set(id, detail);
    keepNewest(this.unjournaledPrepares, REMEMBERED_CHECKPOINTS);
    return new CheckpointError("journal_unavailable", detail, { cause });
  }

  /**
   * checkpoint.json of `id`, once every participant's manifest.json matches the digest it records
   * and its records file the manifest's digest and count: damage (tampering, a bad copy, a lost or
   * truncated file) is refused here before anything is sent. Records are hashed, not parsed (one
   * pass at storage speed). The restore message pins the manifest's digest too, so a manifest
   * replaced after this check is refused by its participant. A bounded number at a time: thousands
   * of participants must not hold thousands of files open at once (EMFILE).
   */
  private async committedManifests(id: string): Promise<GlobalManifest> {
    const manifest = await this.options.catalog.get(id);
    const dir = this.options.catalog.dirFor(id);
    for (let i = 0; i < manifest.participants.length; i += MANIFEST_READS_AT_ONCE) {
      // Records too, not just manifests: a participant refusing damaged records would leave the
      // others' installs for the clean-up to retire, fencing attempt+1 everywhere for nothing.
      await Promise.all(manifest.participants.slice(i, i + MANIFEST_READS_AT_ONCE).map((p) => checkCommittedRecords(dir, id, p)));
    }
    return manifest;
  }

  /**
   * Sends `open`'s restore (its id, directory and scope, each member's manifest digest when known;
   * this leader's epoch) to every member and
   * settles it all or nothing: every member restored → journaled `restored`, and the reply kept in
   * `open.restore` for a retry; otherwise (journaled `restore_cleanup`) attempt+1 is retired where
   * it may have been installed, everyone resumes, and it throws `restore_failed`. Recovery
   * re-drives a predecessor's restore (`journaled`: its entry's state) through here: a member that
   * restored it already answers from its reply cache (kept per id, directory and scope, whatever
   * the epoch and deadline), one that never got it installs it now. A first send (`first`: what its
   * opening forgot, and the leader term it opened in) that every member refused is answered as that
   * refusal (refuseRestore).
   */
  private driveRestore(open: OpenCheckpoint, deadlineMs: number, ctx: Context | undefined, journaled: undefined, first: FirstRestoreSend): Promise<CtlReplyOf<"restore">>;
  private driveRestore(open: OpenCheckpoint, deadlineMs: number, ctx: Context | undefined, journaled: "restoring" | "restored"): Promise<CtlReplyOf<"restore"> | undefined>;
  private async driveRestore(
    open: OpenCheckpoint,
    deadlineMs: number,
    ctx: Context | undefined,
    journaled?: "restoring" | "restored",
    first?: FirstRestoreSend,
  ): Promise<CtlReplyOf<"restore"> | undefined> {
    const { id, epoch } = open;
    const request = { checkpoint_id: id, deadline_ts: deadlineMs / 1000, epoch, checkpoint_dir: open.dir ?? this.options.catalog.dirFor(id), episode_ids: open.scope ?? [] };
    // Re-sent, it may install into a process newer than the journaled restorer: the view now is
    // "the view at open" for that one, as for a first restore (one lagging behind it is no restart).
    const viewAtSend = journaled ? this.incarnationsOf(open.members) : undefined;
    const restorersBefore = new Map(open.incarnations);
    const outcomes = await runAll(open.members, (m) => {
      const digest = open.manifestDigests?.get(memberKey(m.kind, m.instance));
      return this.send(m, "restore", digest === undefined ? request : { ...request, manifest_sha256: digest }, deadlineMs, epoch, ctx);
    });
    for (const [key, restorer] of open.incarnations) {
      const seen = viewAtSend?.get(key);
      if (seen !== undefined && restorer !== restorersBefore.get(key)) open.viewed.set(key, seen);
    }
    // Journaled `restored`, every member had restored it: one refusing it as already resumed took
    // part and was resumed since (its controller's resume, cut short by the crash, or its lease).
    const resumed = journaled === "restored" ? outcomes.filter((o) => !o.ok && o.code === "stale_checkpoint") : [];
    const failures = failuresOf(outcomes).filter((f) => !resumed.includes(f));
    if (failures.length === 0) {
      // Resumed everywhere: its entry outlived the close. Nothing is left to do.
      if (resumed.length && resumed.length === outcomes.length) {
        this.close(id);
        return undefined;
      }
      open.phase = "restored";
      await this.journal(open, "restored").catch((error: unknown) => {
        // A deposed leader answers nothing. Any other failed write (a KV timeout) leaves the entry
        // `restoring`, which a successor re-drives into the same reply (the participants keep it):
        // failing here instead would leave everyone parked in a restore its controller abandons.
        if (toCheckpointError(error).code === "not_leader") throw error;
        this.checkpointLog(id).warn({ err: error }, "restored_not_journaled");
      });
      // Partly resumed: there is no whole reply to give again; the controller's resume finishes it.
      if (resumed.length) return undefined;
      open.restore = {
        checkpoint_id: id,
        participants: outcomes.map((o) => ({ kind: o.participant.kind, instance: o.participant.instance, restored: o.ok ? o.reply.restored : [] })),
      };
      return open.restore;
    }
    // Every participant refused this restore before installing anything (a first send: a re-driven
    // one may have installed before): nothing to clean up, so its refusal is the answer. Not when one
    // is parked in another checkpoint (a stop checkpoint's processes): the clean-up's resume lets it go.
    if (first && failures.length === outcomes.length && failures.every((f) => RESTORE_REFUSALS.has(f.code) && !PARKED_ELSEWHERE.has(f.code))) {
      return this.refuseRestore(open, failures, deadlineMs, first);
    }
    // A participant's refusal changed nothing there; anywhere else the restore may have installed
    // attempt+1 (it did, or the outcome is unknown), and only there must it be retired: retiring it
    // at a process that refused would fence rollouts it runs (a restore sent to live processes).
    // A predecessor's restore may have installed it before: journaled `restored`, it did at every
    // member; journaled `restoring`, a member refusing as already resumed may have installed it and
    // resumed by its lease since.
    const installedMaybe =
      journaled === "restored"
        ? open.members
        : outcomes.filter((o) => o.ok || !RESTORE_REFUSALS.has(o.code) || (journaled === "restoring" && o.code === "stale_checkpoint")).map((o) => o.participant);
    return this.failRestore(open, installedMaybe, combinedFailure("restore", failures), deadlineMs, ctx);
  }

  /**
   * What a restore of `id` forgets as it opens (a failure remembered, a stop checkpoint to release),
   * and a function putting it back, for a restore every participant refused: it changed nothing.
   */
  private forgetRestoreHistory(id: string): () => void {
    const failure = this.restoreFailures.get(id);
    const failed = this.failedRestores.get(id);
    const stopped = this.stopped.has(id);
    this.restoreFailures.delete(id);
    this.failedRestores.delete(id);
    this.refusedRestores.delete(id); // sent again: this one's outcome answers its retries
    this.stopped.delete(id); // restored into fresh processes: its resume is the restore's
    return () => {
      if (failure !== undefined) this.restoreFailures.set(id, failure);
      if (failed) this.failedRestores.set(id, failed);
      if (stopped) this.stopped.add(id);
    };
  }

  /**
   * A restore every participant refused (RESTORE_REFUSALS: nothing installed, nobody parked by it;
   * one that closed admission reopened it before refusing): no clean-up, whose resume would fence
   * the id and whose remembered restore_failed would tell the controller to restart rollouts those
   * processes still run. Its open state and journal entry go, answered once the entry is removed
   * (a successor re-driving it would take a stale_checkpoint for an install since resumed, and retire
   * attempt+1 there); then the refusal, the common code or the first, naming every participant.
   * The term it opened in lost since (while its sends were in flight), its entry and the id's
   * records are the next term's: nothing is noted or removed here.
   */
  private async refuseRestore(open: OpenCheckpoint, failures: Failure[], deadlineMs: number, { putBack, term }: FirstRestoreSend): Promise<never> {
    this.checkpointLog(open.id).info({ refusals: failures.map((f) => `${refName(f.participant)}: ${f.code}`) }, "restore_refused_everywhere");
    // Not close(): the id is left as it was (closed or not), not fenced here by a restore that did nothing.
    if (this.open === open) this.open = undefined;
    putBack();
    const refusal = combinedFailure("restore", failures);
    // Deposed (as the failed-write path in restore()): read late, leaderTerm would put the record in
    // the next term's map (emptied by leadershipLost) and run the removal as that term's, deleting
    // the entry its recovery finishes. The op answers outcome_unknown (runOp: the term changed).
    if (term !== this.leaderTerm) throw refusal;
    // It changed nothing: an earlier restore's record stays as it was.
    this.removalRecords(open.id, open.outcomeBefore);
    const removal = this.removeEntry(open.id, this.journalWrites.get(open.id), term, open.outcomeBefore);
    await this.entryRemoved(
      open.id,
      removal,
      deadlineMs,
      `the restore of checkpoint ${open.id} was refused by every participant (nothing installed)`,
      "a successor may still send it again and clean it up (restore_failed); retry the restore once a leader serves",
    );
    this.refusedRestores.delete(open.id);
    this.refusedRestores.set(open.id, { scope: open.scope ?? [], refusal });
    keepNewest(this.refusedRestores, REMEMBERED_CHECKPOINTS);
    throw refusal;
  }

  /**
   * A failed restore's all-or-nothing clean-up: attempt+1 retired at `installedMaybe`, everyone
   * resumed; throws restore_failed for `cause`, remembered for the restore's retries.
   */
  private async failRestore(open: OpenCheckpoint, installedMaybe: ParticipantRef[], cause: CheckpointError, deadlineMs: number, ctx: Context | undefined): Promise<never> {
    const { id } = open;
    // Journaled first, so a successor finishes this clean-up (at the same members) instead of
    // re-driving the restore: participants keep their restore reply past a retire, so a re-sent
    // restore would look restored where attempt+1 was retired already.
    open.retireAt = installedMaybe;
    await this.journal(open, "restore_cleanup").catch((error: unknown) => {
      // A deposed leader sends nothing more. Any other failed write (a KV timeout) must not leave
      // attempt+1 installed and everyone parked in a restore a resume would take for an abort: the
      // clean-up runs anyway. The entry still says `restoring`, so a successor re-drives the restore,
      // and the members resumed here refuse it as already resumed, which cleans up again.
      if (toCheckpointError(error).code === "not_leader") throw error;
      this.checkpointLog(id).warn({ err: error }, "restore_cleanup_not_journaled");
    });
    const cleanup = await this.restoreCleanup(open, deadlineMs, ctx);
    const message = cleanedUpDetail(cleanup, cause.message, installedMaybe);
    const data = cleanedUpData(cleanup, cause.data);
    this.rememberFailedRestore(open, message, data);
    throw new CheckpointError("restore_failed", message, { data });
  }

  /** Keeps a cleaned-up restore's failure for its retries (see failedRestores), for the last few ids. */
  private rememberFailedRestore(open: OpenCheckpoint, message: string, data: Record<string, unknown>): void {
    this.failedRestores.delete(open.id);
    this.failedRestores.set(open.id, { scope: open.scope, members: open.members, incarnations: new Map(open.incarnations), viewed: new Map(open.viewed), message, data });
    keepNewest(this.failedRestores, REMEMBERED_CHECKPOINTS);
  }

  /**
   * The failure to answer a restore of `id` with `scope` again: the one its clean-up ran for, as long
   * as the membership view shows every member still the process that clean-up resumed. A member it
   * does not show, or shows restarted, may be a fresh process a new restore could install into.
   */
  private failedRestoreRetried(id: string, scope: EpisodeId[]): CheckpointError | undefined {
    const failed = this.failedRestores.get(id);
    if (!failed || !sameScope(failed.scope, scope)) return undefined;
    const sameProcesses = failed.members.every((m) => {
      const key = memberKey(m.kind, m.instance);
      const now = this.options.membership.incarnationOf?.(m);
      return now !== undefined && (now === failed.incarnations.get(key) || now === failed.viewed.get(key));
    });
    return sameProcesses ? new CheckpointError("restore_failed", failed.message, { data: failed.data }) : undefined;
  }

  /**
   * All-or-nothing restore clean-up: retire attempt+1 at `open.retireAt` (where the restore may have
   * installed it; default everyone, as journaled in `restore_cleanup`), each stage until its share
   * of the clean-up's window (cleanupStageDeadline), sent again where it failed and the restoring
   * process may still run until the clean-up's deadline; then resume everyone (the
   * protocol's rule: a participant is never left parked by a failed restore), sent again where it
   * did not get through until that deadline. Neither is sent again to a participant the membership
   * registry no longer lists (stillListed). Returns the retires that still failed, for the reply to
   * name first (what those participants restored may still be held there), and the resumes.
   */
  private async restoreCleanup(open: OpenCheckpoint, deadlineMs: number, ctx: Context | undefined): Promise<CleanupResult> {
    const retireAt = open.retireAt ?? open.members;
    const { clock } = this.options;
    this.restoreFailures.set(open.id, `the restore of checkpoint ${open.id} was cleaned up (attempt+1 retired where it may have been installed, everyone resumed): restart those rollouts from input`);
    const cleanupDeadline = Math.max(deadlineMs, clock.now() + RESTORE_CLEANUP_MS);
    const epoch = open.epoch;
    const replacements = (open.scope ?? []).map(nextAttempt);
    const listed = (members: ParticipantRef[]) => this.stillListed(members);
    let unretired: CleanupFailure[] = [];
    if (replacements.length && retireAt.length) {
      const retire = async (members: ParticipantRef[]): Promise<Failure[]> => {
        // One deadline per stage (its members are sent together), set as it starts.
        const stageDeadlines = new Map<number, number>();
        const stageDeadline = (stagesLeft: number): number => {
          let at = stageDeadlines.get(stagesLeft);
          if (at === undefined) stageDeadlines.set(stagesLeft, (at = cleanupStageDeadline(clock.now(), cleanupDeadline, stagesLeft, this.options.client.slackMs)));
          return at;
        };
        const { results } = await runStages(
          RETIRE_STAGES,
          members,
          (m, c, stagesLeft) => {
            const at = stageDeadline(stagesLeft);
            return this.send(m, "retire", { checkpoint_id: open.id, deadline_ts: at / 1000, epoch, episode_ids: replacements }, at, epoch, c);
          },
          { spanName: "checkpoint.coordinate.restore.retire", parent: ctx },
        );
        return failuresOf(results.flatMap((r) => r.outcomes));
      };
      // Sent again where the restoring process may still run (a free that failed, a timed-out try, no responders) while the deadline allows.
      unretired = cleanupFailures(await sentAgainUntil(clock, cleanupDeadline, await retire([...retireAt]), retireWorthRetrying, retire, listed));
      if (unretired.length) this.log.warn({ checkpoint_id: open.id, failures: unretired.map((f) => `${refName(f.participant)}: ${f.code}${f.unlisted ? " (unlisted)" : ""}`) }, "restore_retire_incomplete");
    }
    // Another incarnation answered: the restoring process is gone, and what it restored with it.
    const held = unretired.filter(retireWorthRetrying);
    if (held.length) {
      this.restoreFailures.set(open.id, `${unretiredNote(held)}the restore of checkpoint ${open.id} was cleaned up (attempt+1 retired where it may have been installed, everyone resumed): restart those rollouts from input`);
    }
    let unresumed: CleanupFailure[] = [];
    try {
      // Everyone, also where the retire failed: a participant left parked would refuse every
      // prepare and a plain retire until its lease expired, and then resume all the same.
      const { failures } = await this.resumeEveryone(open.id, cleanupDeadline, ctx);
      const resend = async (members: ParticipantRef[]) => (await this.resendResume(open.id, members, cleanupDeadline, ctx)).failures;
      const left = cleanupFailures(await sentAgainUntil(clock, cleanupDeadline, failures, resumeWorthRetrying, resend, listed));
      // Closed either way; where it still failed, a resume of the id sends it again (unresumed).
      if (left.length) this.log.warn({ checkpoint_id: open.id, err: combinedFailure("resume", left) }, "restore_resume_incomplete");
      // Named in the reply where it did not get through (a refusal is that participant's answer; a restart counts as resumed).
      unresumed = left.filter(resumeWorthRetrying);
    } catch (error) {
      this.log.warn({ checkpoint_id: open.id, err: error }, "restore_resume_incomplete");
    }
    return { unretired: held, unresumed };
  }

  /**
   * Those of `members` the membership registry still lists (an entry it cannot read counts: the
   * participant still sends its heartbeat). A clean-up sends again only to them. A registry that
   * cannot be read lists them all: a resend costs a pause, giving up may leave attempt+1 held. So
   * does one whose view is stale (this coordinator's own connection lost, not read since): cut off
   * for a TTL, it ages every member out, and their absence says nothing of them.
   */
  private async stillListed(members: readonly ParticipantRef[]): Promise<ReadonlySet<ParticipantRef>> {
    try {
      const { membership } = this.options;
      const keys = new Set((await membership.list()).map((m) => memberKey(m.kind, m.instance)));
      // After the listing: it waits for a read in flight, which makes the view current again.
      if (membership.viewCurrent?.() === false) return new Set(members);
      for (const u of (await membership.unreadable?.()) ?? []) keys.add(u.key);
      return new Set(members.filter((m) => keys.has(memberKey(m.kind, m.instance))));
    } catch (error) {
      this.log.warn({ err: error }, "membership_unlisted_check_failed");
      return new Set(members);
    }
  }

  // ---- helpers --------------------------------------------------------------------------

  /**
   * Runs controller op `name` under the lock, in its span. `requestedId` is the checkpoint the
   * request names, if any; an op that finds its checkpoint later (restore of LATEST, retire in a
   * restored one) passes it to `identify`, for the span attribute and the failure log. No id, no field.
   * An op that takes a deadline (`timed`, its request) and is still waiting for the ops ahead of it
   * at that deadline plus request_slack_ms answers `deadline_exceeded` then and never runs (queueBound),
   * unless the op running then is the one it repeats.
   */
  private async op<T>(
    name: string,
    requestedId: string | undefined,
    fn: (ctx: Context, identify: (id: string) => void) => Promise<T>,
    timed?: { deadline_ts?: number | undefined },
    /** Called with what the op answers when it fails, still under the lock (before a retry queued behind it runs). */
    onFailure?: (error: unknown) => void,
  ): Promise<T> {
    const queue = timed ? this.queueBound(name, requestedId, timed.deadline_ts) : undefined;
    const ran = this.lock.run(async () => {
      if (queue && !queue.admit()) return undefined as T; // answered deadline_exceeded already
      this.runningOp = { name, id: requestedId };
      // A retry waiting past its bound for the op it repeated waits for that op only, not for this one.
      for (const [giveUp, repeats] of this.overdue) {
        if (repeats.name === name && repeats.id === requestedId) continue;
        this.overdue.delete(giveUp);
        giveUp();
      }
      try {
        return await this.runOp(name, requestedId, fn);
      } catch (error) {
        onFailure?.(error);
        throw error;
      } finally {
        this.runningOp = undefined;
      }
    });
    return queue ? Promise.race([ran, queue.expired]) : ran;
  }

  /**
   * How long a timed op waits its turn: until its deadline (the default timeout from now when it
   * names none), or now for a retry whose deadline passed (its reply was lost), plus
   * request_slack_ms, the time the op ahead of it may run past that deadline. Past that, its
   * controller's client (which waits the deadline plus 10 s) would get no answer, or one long
   * after it gave up on an op that never ran. Not a retry of the op running then (same op, same
   * id, or both a restore of LATEST: repeatsRunningOp): that op may end past its deadline by design (a checkpoint's resume and publication, a
   * restore's clean-up), and the retry waits for it and gets its reply, as docs/api.md promises a
   * retry; answered `deadline_exceeded` ("never ran"), its controller would take a published
   * checkpoint for one that never happened. Such a retry gives up once another op runs (overdue):
   * it waits for the op it repeats, not for the ones queued behind that. `expired` rejects then;
   * `admit` (under the lock) says whether the op may still run, and stops the timer. None for a
   * deadline past the cap: the op refuses it (invalid_request) as soon as it runs.
   */
  private queueBound(name: string, requestedId: string | undefined, deadlineTs: number | undefined): { expired: Promise<never>; admit: () => boolean } | undefined {
    const now = this.options.clock.now();
    const deadlineMs = deadlineTs === undefined ? now + this.options.defaultTimeoutMs : deadlineTs * 1000;
    if (deadlineMs > now + MAX_DEADLINE_AHEAD_S * 1000) return undefined;
    const arrived = this.options.clock.monotonic();
    let gaveUp = false;
    let cancel: () => void = () => undefined;
    let giveUp: () => void = () => undefined;
    const expired = new Promise<never>((_resolve, reject) => {
      giveUp = () => {
        gaveUp = true;
        const error = new CheckpointError("deadline_exceeded", `${name}${requestedId === undefined ? "" : ` ${requestedId}`}: its deadline passed while it waited for the ops sent before it; it never ran`);
        this.checkpointLog(requestedId).warn({ op: name, code: error.code }, "controller_op_failed");
        coordinatorTelemetry().opDuration.record((this.options.clock.monotonic() - arrived) / 1000, { op: name, outcome: error.code });
        reject(error);
      };
      cancel = this.options.clock.setTimer(() => {
        if (this.repeatsRunningOp(name, requestedId)) this.overdue.set(giveUp, { name, id: requestedId });
        else giveUp();
      }, Math.max(deadlineMs, now) - now + this.options.client.slackMs);
    });
    return {
      expired,
      admit: () => {
        cancel();
        this.overdue.delete(giveUp);
        return !gaveUp;
      },
    };
  }

  /**
   * Whether op `name` on `requestedId` may be a retry of the op running now: the same op on the
   * same checkpoint id. A restore of LATEST names no id: one behind a running restore of LATEST
   * counts as its retry, by name and absent id, not by the id that restore resolved. The LATEST it
   * will resolve is that same id: nothing publishes while that restore runs (one op at a time),
   * and a retry that waited past its bound gives up as soon as another op runs (overdue). So a
   * restore of LATEST sent after a new publication never waits here as a retry of an older one.
   * Whether it is really the retry (same scope) the restore itself decides when it runs. A
   * checkpoint without id is never a retry (each generates a fresh id); retire and forget without
   * one end by their deadline, so need no exemption.
   */
  private repeatsRunningOp(name: string, requestedId: string | undefined): boolean {
    const running = this.runningOp;
    if (!running || running.name !== name || running.id !== requestedId) return false;
    return requestedId !== undefined || name === "restore";
  }

  /** The body of `op`, under the lock. */
  private async runOp<T>(name: string, requestedId: string | undefined, fn: (ctx: Context, identify: (id: string) => void) => Promise<T>): Promise<T> {
    const started = this.options.clock.monotonic(); // durations: a wall-clock step must not skew them
    const effectsBefore = this.effects;
    const termBefore = this.leaderTerm;
    let id = requestedId;
    const failed = (thrown: unknown, level: "warn" | "debug" = "warn"): unknown => {
      let error = thrown;
      // not_leader promises nothing happened, and clients retry it (even with a fresh id): once
      // this op has sent or journaled anything, a successor may complete it, so it is unknown.
      // So is any failure of an op whose leadership was lost meanwhile, whatever it says: losing
      // it dropped the open checkpoint here (a commit that succeeded everywhere then finds it
      // `not_found`), while its journal entry is the successor's to complete.
      const lost = (error instanceof CheckpointError && error.code === "not_leader") || this.leaderTerm !== termBefore;
      if (lost && this.effects !== effectsBefore) {
        error = new CheckpointError("outcome_unknown", `${name}${id === undefined ? "" : ` ${id}`}: leadership was lost after it began, so it may still take effect (${toCheckpointError(error).message}); retry with the same checkpoint id once a leader serves`, { cause: error });
      }
      const code = toCheckpointError(error).code; // what the APIs answer: storage_error for a full disk
      coordinatorTelemetry().opDuration.record((this.options.clock.monotonic() - started) / 1000, { op: name, outcome: code });
      if (level === "warn" && isOutsideOp(name, id)) this.outsideSpell(`op ${name}`, this.log, "controller_op_succeeds_again").failed(error, "controller_op_failed", { op: name, code });
      else this.checkpointLog(id)[level]({ op: name, code, err: error }, "controller_op_failed");
      return error;
    };
    const attributes = id === undefined ? { [SPAN_ATTR.op]: name } : { [SPAN_ATTR.checkpointId]: id, [SPAN_ATTR.op]: name };
    return inSpan(`checkpoint.coordinate.${name}`, attributes, undefined, async (ctx, span) => {
      const identify = (found: string) => {
        id = found;
        span.setAttribute(SPAN_ATTR.checkpointId, found);
      };
      // Refused in the op's span too: the controller's trace shows the not_leader it got. Logged at
      // debug: a follower (or a leader still waiting out its first lease period) is asked again
      // every 100 ms by each client retrying not_leader, and nothing happened here.
      if (!this.recoveredFlag) throw failed(new CheckpointError("not_leader", this.notServingYet()), "debug");
      try {
        const result = await fn(ctx, identify);
        coordinatorTelemetry().opDuration.record((this.options.clock.monotonic() - started) / 1000, { op: name, outcome: "ok" });
        if (isOutsideOp(name, id)) this.outsideSpellEnded(`op ${name}`, { op: name });
        return result;
      } catch (thrown) {
        // Inside the op's span, so controller_op_failed carries its trace_id / span_id (even
        // when the controller sent no trace context) and the span gets the code the reply has.
        throw failed(thrown);
      }
    });
  }

  /**
   * `list` and `get` read the catalog, which withholds an aborted checkpoint whose checkpoint.json
   * could not be taken back only once this leader knows of it: its own abort, or its recovery's
   * reading of the journal entry kept for it. A follower or a leader still recovering would serve
   * that checkpoint as published, so they refuse `not_leader` as every op does before recovery; so
   * does a leader whose renewal lapsed (frozen, starved: a successor may lead and have aborted one),
   * which every other op finds at its first Leadership.epoch() and the NATS API by staying silent.
   */
  private assertCatalogKnown(): void {
    if (!this.recoveredFlag) throw new CheckpointError("not_leader", this.notServingYet());
    this.options.leadership.epoch();
  }

  /** Why ops are refused before recovery: a follower is told so, a new leader that it is still recovering. */
  private notServingYet(): string {
    const state = this.options.leadership.state();
    const other = this.options.leadership.leaderOfOtherVersion();
    if (!state.leader && other !== undefined) return `coordinator ${state.id} is not the leader: ${other}`;
    if (!state.leader) return `coordinator ${state.id} is not the leader (another coordinator is active, or none yet): send controller ops to the leader`;
    if (!state.ready) return `coordinator ${state.id} just became leader and waits one lease period before sending anything`;
    return `coordinator ${state.id} is the leader but has not finished recovering its predecessor's checkpoints yet`;
  }

  private async send<O extends Op>(
    member: ParticipantRef,
    op: O,
    request: RequestOf<O>,
    deadlineMs: number,
    epoch: number,
    ctx: Context | undefined,
  ): Promise<Outcome<O>> {
    // Fencing on the sending side: a demoted coordinator stops before the participants must refuse it.
    this.options.leadership.assert(epoch);
    const id = (request as { checkpoint_id?: string }).checkpoint_id;
    const log = this.opLog(op, id);
    const incarnation = GUARDED.has(op) ? this.recordedIncarnation(member, id) : undefined;
    // The membership view already shows a restart: skip the round trip the participant would refuse.
    const restarted = incarnation === undefined ? null : this.restartedSince(member, id!, incarnation);
    if (restarted) {
      log.info({ op, detail: restarted }, "participant_restarted_skipped");
      if (op === "resume") return this.resumedElsewhere(member, id, restarted);
      return { ok: false, participant: member, code: "unreachable", detail: restarted };
    }
    const body = incarnation === undefined ? request : { ...request, incarnation };
    this.effects++;
    const replaced = this.watchReplacement(member, op, id, incarnation);
    let outcome: Outcome<O>;
    try {
      outcome = await this.options.client.call(member, op, body, deadlineMs, {
        ...(ctx && { parent: ctx }),
        guard: () => this.options.leadership.assert(epoch),
        ...(replaced && { cancellation: replaced.cancellation }),
        // Only the addressed process can answer it: one gone from NATS is not waited for.
        probePresence: incarnation !== undefined,
      });
    } finally {
      replaced?.stop();
    }
    if (!outcome.ok && replaced?.cancellation.reason) {
      // Its process died with the request (a SIGKILL mid-op) and a new one announced itself: the
      // old one will never answer, and the new one would refuse the message as another incarnation.
      log.info({ op, detail: outcome.detail }, "participant_restarted_abandoned");
      if (op === "resume") return this.resumedElsewhere(member, id, outcome.detail);
      return outcome;
    }
    if (!outcome.ok && outcome.code === "stale_incarnation") {
      // A new process the view did not show yet: it refused, so it holds nothing and stays unfenced.
      log.info({ op, kind: member.kind, instance: member.instance, detail: outcome.detail }, "participant_restarted_refused");
      if (op === "resume") return this.resumedElsewhere(member, id, outcome.detail);
      return outcome;
    }
    if (outcome.ok && op === "restore") this.recordRestorer(member, id, (outcome.reply as ReplyOf<"restore">).incarnation);
    const outside = id !== undefined && !namesCheckpoint(op, id);
    const memberLog = log.child({ kind: member.kind, instance: member.instance });
    if (!outcome.ok) {
      const fields = { op, code: outcome.code, detail: outcome.detail };
      if (outside) this.outsideSpell(`${op} ${refName(member)}`, memberLog, "participant_answers_again").failed(undefined, "participant_refused", fields);
      else memberLog.warn(fields, "participant_refused");
    } else if (outside) this.outsideSpellEnded(`${op} ${refName(member)}`, { op });
    return outcome;
  }

  /**
   * A resume that a process started after the checkpoint opened needs not: it holds nothing of it.
   * Of a restored checkpoint, that process lost what it restored: noted for resumeRestored.
   */
  private resumedElsewhere<O extends Op>(member: ParticipantRef, id: string | undefined, detail: string): Outcome<O> {
    const open = this.open;
    // Not another checkpoint's: a closed one's resume sent again (resumeAgain) while a restore is open.
    if (open?.phase === "restored" && open.id === id) (open.lostRestorers ??= new Map()).set(refName(member), detail);
    return { ok: true, participant: member, reply: { phase: "idle", idempotent: true } as ReplyOf<O> };
  }

  /** Keeps `reply` as the answer to a retry of (`id`, `op`) with the same arguments. */
  private remember<T>(id: string, op: string, args: string, reply: T): T {
    let ops = this.replies.get(id);
    if (!ops) {
      ops = new Map();
      this.replies.set(id, ops);
      keepNewest(this.replies, REMEMBERED_CHECKPOINTS);
    }
    ops.set(op, { args, reply });
    return reply;
  }

  /**
   * `checkpoint_conflict` when a retry of (`id`, `op`) that already succeeded has other arguments,
   * open or not; else the remembered reply once `id` is no longer open (open checkpoints answer
   * retries from their own state).
   */
  private replayed<O extends "checkpoint" | "commit" | "publish">(id: string, op: O, args: string): CtlReplyOf<O> | undefined {
    const kept = this.replies.get(id)?.get(op);
    if (kept && kept.args !== args) {
      throw new CheckpointError("checkpoint_conflict", `checkpoint ${id} was already ${{ checkpoint: "checkpointed", commit: "committed", publish: "published" }[op]} with other arguments`);
    }
    if (!kept || this.open?.id === id) return undefined;
    return kept.reply as CtlReplyOf<O>;
  }

  /**
   * The checkpoint.json of a published id this coordinator keeps no reply for, when it records the
   * arguments of the `checkpoint` or `publish` retried: a reply lost after the op finished, retried
   * at a successor (the predecessor removed its journal entry once everyone resumed) or here after
   * REMEMBERED_CHECKPOINTS later ids pushed the reply out. Undefined when the id is not published,
   * or open here (the open checkpoint answers), or (`checkpoint`) published with other arguments:
   * the op then refuses the id by its own checks. A `publish` naming another controller state than
   * checkpoint.json records is `checkpoint_conflict`, open or not, as a kept reply's arguments are.
   */
  private async publishedWith(id: string, state: ControllerStateInput | null, commit?: { episode_ids: EpisodeId[] | null; stop: boolean }): Promise<GlobalManifest | undefined> {
    const open = this.open?.id === id ? this.open : undefined;
    // Open and not published yet, it has no checkpoint.json of its own: its publish decides.
    // An aborted checkpoint whose checkpoint.json is still there was never published: a retry is not answered from it.
    if ((open && (commit || open.phase !== "published")) || !this.options.catalog.has(id) || this.options.catalog.untakenBack.has(id)) return undefined;
    const manifest = await this.options.catalog.get(id);
    if (commit) return manifest.stop === commit.stop && sameScope(manifest.scope, commit.episode_ids) && sameControllerState(manifest.controller_state, state) ? manifest : undefined;
    if (!sameControllerState(manifest.controller_state, state)) {
      throw new CheckpointError("checkpoint_conflict", `checkpoint ${id} was already published with another controller state`);
    }
    return open ? undefined : manifest;
  }

  private publishReplyOf(manifest: GlobalManifest): CtlReplyOf<"publish"> {
    const id = manifest.checkpoint_id;
    return { checkpoint_id: id, manifest_path: join(this.options.catalog.dirFor(id), GLOBAL_MANIFEST_FILE), published_at: manifest.published_at, deleted: [] };
  }

  /**
   * A `checkpoint` reply rebuilt from its checkpoint.json: what retention deleted then and which
   * participants failed to resume are not recorded there (those resumed when their lease expired).
   */
  private checkpointReplyOf(manifest: GlobalManifest): CtlReplyOf<"checkpoint"> {
    const { checkpoint_id, manifest_path, published_at } = this.publishReplyOf(manifest);
    return {
      checkpoint_id,
      epoch: manifest.epoch,
      checkpoint_dir: this.options.catalog.dirFor(checkpoint_id),
      manifest_path,
      published_at,
      participants: manifest.participants.length,
      restarts: manifest.restarts,
      deleted: [],
      resume_failures: [],
      timings_ms: { prepare: 0, commit: 0, publish: 0, resume: 0 },
    };
  }

  /** A checkpoint (or restore) this coordinator opens now, at its epoch, with its members' incarnations. */
  private opening(id: string, phase: OpenPhase, members: ParticipantRef[], fields: Partial<OpenCheckpoint> = {}): OpenCheckpoint {
    const viewed = this.incarnationsOf(members);
    const epoch = this.options.leadership.epoch();
    return {
      id,
      phase,
      epoch,
      members,
      incarnations: new Map(viewed),
      viewed,
      preparedAt: this.options.clock.now() / 1000,
      openedEpoch: epoch,
      openedSeq: ++this.openSeq,
      restarts: [],
      dir: null,
      scope: null,
      stop: false,
      autoPublish: false,
      controllerState: null,
      ...fields,
    };
  }

  private incarnationsOf(members: readonly ParticipantRef[]): Map<string, string> {
    const incarnations = new Map<string, string>();
    for (const m of members) {
      const incarnation = this.options.membership.incarnationOf?.(m);
      if (incarnation !== undefined) incarnations.set(memberKey(m.kind, m.instance), incarnation);
    }
    return incarnations;
  }

  /** The incarnation of `member` recorded when the open checkpoint `id` opened, if known. */
  private recordedIncarnation(member: ParticipantRef, id: string | undefined): string | undefined {
    return this.addressing(id)?.incarnations.get(memberKey(member.kind, member.instance));
  }

  /** How checkpoint `id`'s messages are addressed: the open one's, or a closed one's whose resume failed somewhere (resumeAgain). */
  private addressing(id: string | undefined): { incarnations: Map<string, string>; viewed: Map<string, string> } | undefined {
    if (id === undefined) return undefined;
    const open = this.open;
    if (open?.id === id) return open;
    return this.unresumed.get(id);
  }

  /**
   * Why `member`, addressed as incarnation `then` in checkpoint `id`, must not be sent its messages
   * any more, if the view shows it. A view still showing what it showed at open is lagging, not news
   * (a restore reply may have named the newer process already).
   */
  private restartedSince(member: ParticipantRef, id: string, then: string): string | null {
    const now = this.options.membership.incarnationOf?.(member);
    if (now === undefined || now === then || now === this.addressing(id)?.viewed.get(memberKey(member.kind, member.instance))) return null;
    return `${member.kind}/${member.instance} restarted after checkpoint ${id} opened (incarnation ${then} → ${now}); the new process never took part`;
  }

  /**
   * Stops a request waiting on a process the membership view shows replaced (a SIGKILL mid-op, its
   * supervisor starting it again), rather than for the whole try (request_attempt_ms). One
   * addressed to incarnation `then` (guarded) is cancelled, `unreachable`: the new process would
   * refuse it. Any other (restore, retire, forget) goes to whichever process is there: its try is
   * interrupted and it is sent again at once, now to the new process (which, were the view only
   * catching up with it, answers the copy once the first is done). `stop` ends the watch.
   */
  private watchReplacement(member: ParticipantRef, op: Op, id: string | undefined, then: string | undefined): { cancellation: Cancellation; stop: () => void } | undefined {
    const membership = this.options.membership;
    if (!membership.onIncarnationChange) return undefined;
    const cancellation = new Cancellation();
    const stop = membership.onIncarnationChange(member, () => {
      if (then === undefined) {
        this.opLog(op, id).info({ op, kind: member.kind, instance: member.instance }, "participant_replaced_request_resent");
        return cancellation.interrupt(new ReplacedProcessFailure(refName(member)));
      }
      const restarted = this.restartedSince(member, id!, then);
      if (restarted) cancellation.cancel(new CheckpointError("unreachable", `${restarted}; the request in flight to the old process was abandoned`));
    });
    return { cancellation, stop };
  }

  /** The process that restored is the one this restore's resume must reach, whatever the view showed at open. */
  private recordRestorer(member: ParticipantRef, id: string | undefined, incarnation: string | undefined): void {
    const open = this.open;
    if (incarnation === undefined || !open || open.id !== id) return;
    open.incarnations.set(memberKey(member.kind, member.instance), incarnation);
  }

  /** The commit reply of open checkpoint `id`, committed with this scope and stop flag (a retry's answer). */
  private committedReply(id: string, scope: EpisodeId[] | null, stop: boolean): CommitResult | undefined {
    const open = this.open;
    if (open?.id !== id || (open.phase !== "committed" && open.phase !== "published")) return undefined;
    return sameScope(open.scope, scope) && open.stop === stop ? open.commit : undefined;
  }

  /** Closes a published stop checkpoint without a resume (see `stopped`). */
  private closeStopped(id: string): void {
    this.stopped.add(id);
    void this.close(id);
  }

  /**
   * Forgets the open checkpoint and its journal entry; its id stays fenced here. Resolves true once
   * the entry is removed (or nothing of this coordinator's was left to remove), false if it was
   * kept: LATEST's fsync failed, a write for the id came since, or the term ended.
   */
  private close(id: string, afterLatest = true): Promise<boolean> {
    // Abandoned (resumed unpublished, no decision left journaled): its leader may delete what was committed into its directory.
    const abandonedIn = this.abandoned.delete(id) && this.open?.id === id ? this.open.epoch : undefined;
    const outcome = this.restoreOutcomeOf(id);
    this.removalRecords(id, outcome);
    if (this.open?.id === id) this.open = undefined;
    this.closed.delete(id); // re-added: the most recent last
    this.closed.set(id, this.leaderTerm);
    this.unresumed.delete(id); // an earlier closing's failures (before a restore of it) are not this one's
    // What is kept per closed id goes with it: a failed restore's detail too (one per failed restore otherwise, for good).
    keepNewest(this.closed, REMEMBERED_CLOSED, (old) => {
      this.stopped.delete(old);
      this.restoreFailures.delete(old);
      this.unresumed.delete(old);
    });
    void this.options.writer.discard(id, abandonedIn === undefined ? undefined : () => this.stillLeading(abandonedIn));
    // Off the critical path, and only once LATEST's rename is durable: an entry that outlives a
    // crash only makes a successor resume again (idempotent) or repair LATEST. A write for the same
    // id since (a restore of this checkpoint) keeps its entry.
    const writes = this.journalWrites.get(id);
    const term = this.leaderTerm;
    return (afterLatest ? this.options.writer.durable() : Promise.resolve()).then(
      () => {
        // An aborted publication's checkpoint.json that could not be taken back: the entry (undecided)
        // stays, so whoever recovers next takes it back (the writer's memory of it ends with this term).
        if (!this.options.writer.untakenBackOf(id)) return this.removeEntry(id, writes, term, outcome);
        this.log.error({ checkpoint_id: id }, "checkpoint_json_not_taken_back_journal_entry_kept");
        return this.entryKept(id, writes);
      },
      (error: unknown) => {
        this.log.error({ checkpoint_id: id, err: error }, "latest_fsync_failed_journal_entry_kept");
        return this.entryKept(id, writes);
      },
    );
  }

  /**
   * How a restore of `id` closing now settled, recorded with its entry's removal for a later term's
   * leader (restoreOutcome): cleaned up (or released unresumed) if a failure is remembered, else
   * restored if the restore is what is open; undefined for anything else (no KV write added: the
   * removal is the one every checkpoint makes).
   */
  private restoreOutcomeOf(id: string): RestoreOutcome | undefined {
    if (this.restoreFailures.has(id)) return "restore_failed";
    return this.open?.id === id && (this.open.phase === "restoring" || this.open.phase === "restored") ? "restored" : undefined;
  }

  /** Notes the record a removal of `id`'s entry, scheduled now, writes (see restoreRecords). */
  private removalRecords(id: string, outcome: RestoreOutcome | undefined): void {
    this.restoreRecords.delete(id); // re-added: the most recent last
    if (outcome === undefined) return;
    this.restoreRecords.set(id, outcome);
    keepNewest(this.restoreRecords, REMEMBERED_CLOSED);
  }

  /** close() after a resume, keeping where it failed, and the processes it addressed, for a retry of that resume (resumeAgain). */
  private closeResumed(id: string, failures: readonly Failure[], afterLatest = true): Promise<boolean> {
    const open = this.open?.id === id ? this.open : undefined;
    const removal = this.close(id, afterLatest);
    // Not open here any more: this term ended (leadershipLost), and the id is its successor's.
    if (failures.length && open) {
      this.unresumed.set(id, { members: failures.map((f) => f.participant), incarnations: new Map(open.incarnations), viewed: new Map(open.viewed) });
    }
    return removal;
  }

  /**
   * A resume of a closed checkpoint whose resume failed at `failed`: sent again, stage by stage, to
   * those whose status still shows them holding it or does not answer (never to one that resumed
   * by its lease or restarted: the resume would fence the id there). Where it fails again it is
   * kept for the next retry.
   */
  private async resumeAgain(id: string, failed: readonly ParticipantRef[], deadlineMs: number, ctx: Context | undefined): Promise<CtlReplyOf<"resume">> {
    const { reply, failures } = await this.resendResume(id, failed, deadlineMs, ctx);
    if (failures.length) throw combinedFailure("resume", failures);
    return reply;
  }

  /** resumeAgain's sends, returning where it failed again (kept in `unresumed`) instead of throwing. */
  private async resendResume(id: string, failed: readonly ParticipantRef[], deadlineMs: number, ctx: Context | undefined): Promise<{ reply: CtlReplyOf<"resume">; failures: Failure[] }> {
    const statuses = await this.probeStatuses(failed, this.options.leadership.epoch());
    const targets = failed.filter((m) => mayHoldAt(m, statuses, id));
    const resent = await this.resumeStages(id, targets, deadlineMs, ctx);
    const addressed = this.unresumed.get(id);
    // Those not sent again here (a clean-up gave them up: no longer listed) stay where it failed.
    const resentKeys = new Set(failed.map((m) => memberKey(m.kind, m.instance)));
    const notResent = addressed?.members.filter((m) => !resentKeys.has(memberKey(m.kind, m.instance))) ?? [];
    const stillFailed = [...notResent, ...resent.failures.map((f) => f.participant)];
    if (stillFailed.length && addressed) this.unresumed.set(id, { ...addressed, members: stillFailed });
    else this.unresumed.delete(id);
    return resent;
  }

  /**
   * An entry left in the journal for good by this term (LATEST not durable): its write marker goes
   * too, unless a write came since. Only a later write (which sets its own) removes it here again.
   */
  private entryKept(id: string, writes: number | undefined): false {
    if (this.journalWrites.get(id) === writes) this.journalWrites.delete(id);
    return false;
  }

  /**
   * Removes a closed checkpoint's journal entry. A failed removal (a KV timeout) is retried with
   * capped backoff for as long as this term lasts and no write for the id came since: an entry
   * left behind is acted on by a successor, which would run the clean-up of a restore whose resume
   * succeeded (retiring the attempt+1 its controller runs) once any Gym server restarted.
   */
  private async removeEntry(id: string, writes: number | undefined, term: number, outcome?: RestoreOutcome): Promise<boolean> {
    // A write since, or another term (whose recovery may have journaled this id anew), keeps it.
    const ours = () => this.journalWrites.get(id) === writes && this.leaderTerm === term && this.options.leadership.state().leader;
    for (let attempt = 1; ; attempt++) {
      if (!ours()) return false;
      try {
        await this.options.hooks?.beforeJournalRemove?.(id);
        // Checked again with no await before the removal is queued: a restore of this id may have
        // journaled in the await above, and the journal runs a key's writes in call order.
        if (!ours()) return false;
        await this.options.journal.remove(id, outcome);
        if (this.journalWrites.get(id) === writes) this.journalWrites.delete(id);
        return true;
      } catch (error) {
        // not_leader: another coordinator changed the entry since; it is that one's to handle now.
        const fenced = error instanceof CheckpointError && error.code === "not_leader";
        this.log.warn({ checkpoint_id: id, err: error, attempt, retrying: !fenced }, "journal_remove_failed");
        if (fenced) return false;
        // Jittered, as every retry here: removals failing in one KV outage do not retry in step.
        await this.options.clock.sleep(equalJitter(Math.min(JOURNAL_REMOVE_RETRY_MAX_MS, JOURNAL_REMOVE_RETRY_MS * 2 ** (attempt - 1)), this.options.clock.random));
      }
    }
  }

  /**
   * A restored checkpoint's resume answers only once its journal entry is gone: a successor finding
   * it `resuming` finishes the resume, but runs the restore's clean-up instead if its view shows a
   * restorer restarted by then (it cannot tell a restart after the resume from one before), which
   * would retire the attempt+1 a controller told "resumed" is running. Not removed in time (by the
   * deadline, at least JOURNAL_REMOVE_WAIT_MIN_MS; or kept, the term having ended):
   * `outcome_unknown`, so the controller's retry learns what became of it.
   */
  private completionJournaled(id: string, removal: Promise<boolean>, deadlineMs: number): Promise<void> {
    return this.entryRemoved(
      id,
      removal,
      deadlineMs,
      `checkpoint ${id} was resumed at every participant`,
      "a successor may still finish it as a restore whose participant restarted (restore_failed); retry the resume once a leader serves",
    );
  }

  /**
   * Waits for a closed restore's journal entry removal (by the deadline, at least
   * JOURNAL_REMOVE_WAIT_MIN_MS); not removed in time, or kept: `outcome_unknown` (`what`, so `then`).
   */
  private async entryRemoved(id: string, removal: Promise<boolean>, deadlineMs: number, what: string, then: string): Promise<void> {
    let cancel: (() => void) | undefined;
    const timedOut = new Promise<false>((resolve) => {
      cancel = this.options.clock.setTimer(() => resolve(false), Math.max(deadlineMs - this.options.clock.now(), JOURNAL_REMOVE_WAIT_MIN_MS));
    });
    const removed = await Promise.race([removal, timedOut]).finally(() => cancel?.());
    if (removed) return;
    throw new CheckpointError(
      "outcome_unknown",
      `${what}, but its journal entry could not be removed, so ${then}`,
    );
  }

  /**
   * Leadership was lost: drop the in-memory view of the open checkpoint. The journal, not this
   * memory, is the truth a leader (this one again, or another) recovers from.
   */
  leadershipLost(): void {
    if (this.open) this.log.warn({ checkpoint_id: this.open.id, phase: this.open.phase }, "leadership_lost_open_checkpoint_left_to_journal");
    this.open = undefined;
    this.latestMembers = undefined; // another leader may publish meanwhile
    // Its staged LATEST temp file would stay on disk: this process's sweeps skip what it staged.
    void this.options.writer.discardStagedLatest();
    // The entries are the next leader's (or this one's next recovery's) to finish, and how is theirs:
    // a successor may run a restore's clean-up. Such an id is no longer known closed here, so a retried
    // resume asks the participants (releaseHolders) instead of answering success from this term.
    for (const id of this.restoreRemovals.keys()) this.closed.delete(id);
    this.restoreRemovals.clear();
    // The journal's records are the next term's to read (a successor may write its own meanwhile).
    this.restoreRecords.clear();
    // Likewise the ids whose resume failed somewhere: a successor may have cleaned up, restored or
    // resumed them since, so their retry asks every participant too, not just this term's list.
    for (const id of this.unresumed.keys()) this.closed.delete(id);
    this.unresumed.clear();
    // A deposed leader deletes no checkpoint directory (its successor may use the files).
    this.abandoned.clear();
    // Every removal of this term yields now (leaderTerm), so no marker of its writes is read again.
    this.journalWrites.clear();
    this.leaderTerm++;
    if (this.options.requireRecovery) this.recoveredFlag = false;
  }

  /** The spell of `key` (see outsideSpells), `ended` its closing event. */
  private outsideSpell(key: string, log: Logger, ended: string): FailureSpellLog {
    let spell = this.outsideSpells.get(key);
    if (!spell) {
      this.outsideSpells.set(key, (spell = new FailureSpellLog(log, ended)));
      // Participants come and go: only the most recent failing keys are kept.
      keepNewest(this.outsideSpells, REMEMBERED_SPELLS);
    }
    return spell;
  }

  /** A success of `key`: its spell, if one runs, ends (logged) and is dropped. */
  private outsideSpellEnded(key: string, fields: object): void {
    this.outsideSpells.get(key)?.succeeded(fields);
    this.outsideSpells.delete(key);
  }

  /**
   * The logger of one participant request: its checkpoint's, unless its checkpoint_id is the
   * placeholder of a retire or forget outside any checkpoint, which names no checkpoint.
   */
  private opLog(op: Op, id: string | undefined): Logger {
    return this.checkpointLog(id !== undefined && namesCheckpoint(op, id) ? id : undefined);
  }

  /** The child logger of one checkpoint (cached while it is open). */
  private checkpointLog(id: string | undefined): Logger {
    if (id === undefined) return this.log;
    if (this.open?.id === id) return (this.open.log ??= this.log.child({ checkpoint_id: id, epoch: this.open.epoch }));
    return this.log.child({ checkpoint_id: id });
  }

  private requireOpen(id: string, op: string): OpenCheckpoint {
    const open = this.open;
    if (open && open.id === id) return open;
    if (this.closed.has(id)) throw new CheckpointError("stale_checkpoint", `checkpoint ${id} was already resumed`);
    if (open) throw new CheckpointError("checkpoint_conflict", `checkpoint ${open.id} is open, not ${id}`);
    throw new CheckpointError("not_found", `checkpoint ${id} is not open; ${op} needs a prepared checkpoint`);
  }

  private async outsideCheckpoint(
    op: string,
    requestedId: string | undefined,
    deadlineTs: number | undefined,
  ): Promise<{ checkpointId: string | undefined; members: ParticipantRef[]; epoch: number; deadlineMs: number; restored: boolean }> {
    const deadlineMs = this.deadline(deadlineTs);
    if (this.open) await this.closeIfNobodyHolds(this.open);
    const open = this.open;
    if (open && open.phase !== "restored") {
      throw new CheckpointError("invalid_phase", `${op} is refused while checkpoint ${open.id} is open (${open.phase}); resume first`);
    }
    if (open && requestedId !== undefined && requestedId !== open.id) {
      throw new CheckpointError("checkpoint_conflict", `checkpoint ${open.id} is restored; ${op} must name it`);
    }
    const epoch = this.options.leadership.epoch();
    const members = open ? open.members : await this.options.membership.list();
    // Unreadable entries count, as in prepare: the op fails on them (absentFrom), naming why.
    this.refuseNoParticipants(members, (await this.options.membership.unreadable?.()) ?? []);
    return { checkpointId: open ? open.id : requestedId, members, epoch, deadlineMs, restored: open !== undefined };
  }

  /** The op's deadline (ms); a passed one is `deadline_exceeded`, one too far ahead `invalid_request` (deadlineCapped). */
  private deadline(deadlineTs: number | undefined): number {
    this.deadlineCapped(deadlineTs);
    const now = this.options.clock.now();
    if (deadlineTs === undefined) return now + this.options.defaultTimeoutMs;
    const ms = deadlineTs * 1000;
    if (ms <= now) throw new CheckpointError("deadline_exceeded", "deadline_ts is already in the past");
    return ms;
  }

  /**
   * Refuses a deadline_ts more than MAX_DEADLINE_AHEAD_S ahead (usually milliseconds sent as
   * seconds). Ops check it first, also where they answer a retry from memory: only a deadline that
   * passed is let through there (a lost reply's retry carries one).
   */
  private deadlineCapped(deadlineTs: number | undefined): void {
    if (deadlineTs === undefined || deadlineTs * 1000 <= this.options.clock.now() + MAX_DEADLINE_AHEAD_S * 1000) return;
    throw new CheckpointError("invalid_request", `deadline_ts lies more than ${MAX_DEADLINE_AHEAD_S} s ahead (seconds, not milliseconds)`);
  }

  private async journal(open: OpenCheckpoint, state: JournalEntry["state"]): Promise<void> {
    // A deposed leader journals nothing: its successor may already have recovered (and moved on).
    this.options.leadership.assert(open.epoch);
    this.journalWrites.set(open.id, ++this.journalSeq);
    this.effects++;
    return this.options.journal.record(this.entryOf(open, state));
  }

  /** Refuses (`payload_too_large`) what could not be journaled, before anything is sent or kept. */
  private assertJournalable(open: OpenCheckpoint, state: JournalEntry["state"]): void {
    assertJournalEntryFits(this.entryOf(open, state));
  }

  private entryOf(open: OpenCheckpoint, state: JournalEntry["state"]): JournalEntry {
    const restorers = state === "restored" || state === "resuming";
    const viewed = restorers ? laggingView(open) : undefined;
    return {
      checkpoint_id: open.id,
      epoch: open.epoch,
      state,
      participants: open.members.map((m) => ({ kind: m.kind, instance: m.instance })),
      prepared_at: open.preparedAt,
      checkpoint_dir: open.dir,
      scope: open.scope,
      stop: open.stop,
      restarts: open.restarts,
      auto_publish: open.autoPublish,
      controller_state: open.controllerState,
      ...(state === "restore_cleanup" && { retire_at: (open.retireAt ?? open.members).map((m) => ({ kind: m.kind, instance: m.instance })) }),
      ...(restorers && open.incarnations.size > 0 && { incarnations: Object.fromEntries(open.incarnations) }),
      ...(viewed && { viewed }),
      opened_epoch: open.openedEpoch,
      ...(open.openedSeq !== undefined && { opened_seq: open.openedSeq }),
      updated_at: this.epochTime(open.epoch),
    };
  }
}

/** The view's incarnations at open of the members whose restorer is another process (journaled as `viewed`), if any. */
function laggingView(open: OpenCheckpoint): Record<string, string> | undefined {
  const lagging = [...open.viewed].filter(([key, viewed]) => open.incarnations.has(key) && open.incarnations.get(key) !== viewed);
  return lagging.length ? Object.fromEntries(lagging) : undefined;
}

/**
 * Refuses (`payload_too_large`) a restore whose clean-up could not retire attempt+1 in one message,
 * before anything is journaled or sent. The journal's bound admits the scope, but each attempt+1 can
 * be a digit longer (9 → 10): tens of thousands of short rollout ids can take the clean-up's retire
 * past 1 MiB, and a failed restore's clean-up would then retire attempt+1 nowhere. Held to the journal's
 * bound, which leaves the same room for the message's headers.
 */
function assertCleanupRetireFits(open: OpenCheckpoint, deadlineMs: number): void {
  const retire = { checkpoint_id: open.id, deadline_ts: deadlineMs / 1000, epoch: open.epoch, episode_ids: (open.scope ?? []).map(nextAttempt) };
  const size = Buffer.byteLength(JSON.stringify(retire));
  if (size > MAX_JOURNAL_ENTRY_BYTES) {
    throw new CheckpointError(
      "payload_too_large",
      `restore of checkpoint ${open.id}: the retire of attempt+1 its clean-up would send is ${size} bytes; the limit is ${MAX_JOURNAL_ENTRY_BYTES} (restore fewer episodes)`,
    );
  }
}

/**
 * Orders journal entries as their checkpoints opened: by the opening epoch, then the opening
 * coordinator's count. An entry of a coordinator older than this one (no `opened_seq`) goes by `prepared_at` and
 * before those that have one in its epoch: that epoch's coordinator either wrote none (older than
 * this one) or rewrote it in recovery, so it opened earlier.
 */
function compareOpenedOrder(a: JournalEntry, b: JournalEntry): number {
  const epoch = (a.opened_epoch ?? a.epoch) - (b.opened_epoch ?? b.epoch);
  if (epoch !== 0) return epoch;
  if (a.opened_seq !== undefined && b.opened_seq !== undefined) return a.opened_seq - b.opened_seq;
  if (a.opened_seq !== undefined || b.opened_seq !== undefined) return a.opened_seq === undefined ? -1 : 1;
  return a.prepared_at - b.prepared_at;
}

/**
 * Failures of a commit decision's journal write (doCommit): nothing was sent. A recovery re-driving
 * a journaled decision stops on one instead of aborting the checkpoint (see recoverOne).
 */
const DECISION_NOT_JOURNALED = new WeakSet<object>();

function isDecisionNotJournaled(error: unknown): boolean {
  return typeof error === "object" && error !== null && DECISION_NOT_JOURNALED.has(error);
}

/**
 * A journal write that failed (a KV timeout, the journal's stream gone) before anything was sent:
 * it may still have landed, so its outcome is unknown and the controller sends the op again
 * (`internal_error` it would drop). A catalog refusal (a fenced write's `not_leader`) keeps its code.
 */
function unjournaled(error: unknown, what: string): unknown {
  if (error instanceof CheckpointError) return error;
  const detail = error instanceof Error ? error.message : String(error);
  return new CheckpointError("outcome_unknown", `${what} (${detail})`, { cause: error });
}

/**
 * Drops the oldest keys of `kept` (insertion order: a key re-added after a delete is the newest)
 * until at most `max` stay; `dropped` is told each one.
 */
function keepNewest<K>(kept: Map<K, unknown> | Set<K>, max: number, dropped?: (key: K) => void): void {
  for (const old of kept.keys()) {
    if (kept.size <= max) return;
    kept.delete(old);
    dropped?.(old);
  }
}

/** The participants an op reports as failed without sending them anything (see absentFrom). */
interface Absent {
  /** Their membership entry cannot be read by this build. */
  unreadable: Failure[];
  /** Expected (`expected_participants`), not in the registry. */
  unregistered: Failure[];
}

/** Both groups in member-key order. */
function allAbsent(absent: Absent): Failure[] {
  return [...absent.unreadable, ...absent.unregistered].sort((a, b) => byMemberKey(a.participant, b.participant));
}

/** An expected participant the membership registry does not list: never sent anything. */
function notRegistered(member: ParticipantRef): Failure {
  return {
    ok: false,
    participant: member,
    code: "unreachable",
    detail: `expected participant ${refName(member)} is not in the membership registry (no heartbeat within ${MEMBER_TTL_MS / 1000} s)`,
  };
}

/** `unreachable`: the registry holds entries this coordinator cannot read, each named with why (bounded). */
function unreadableRefusal(what: string, unreadable: readonly UnreadableMember[]): CheckpointError {
  const reasons = unreadable.slice(0, 10).map((u) => u.reason.slice(0, 300));
  const more = unreadable.length > reasons.length ? `; and ${unreadable.length - reasons.length} more` : "";
  return new CheckpointError("unreachable", `${what}: the membership registry holds entries this coordinator cannot read: ${reasons.join("; ")}${more}`);
}

function byMemberKey(a: ParticipantRef, b: ParticipantRef): number {
  return memberKey(a.kind, a.instance) < memberKey(b.kind, b.instance) ? -1 : 1;
}

/** Each participant's manifest_sha256 in checkpoint.json, by member key. */
function manifestDigestsOf(manifest: GlobalManifest): Map<string, string> {
  return new Map(manifest.participants.map((p) => [memberKey(p.kind, p.instance), p.manifest_sha256]));
}

/** A duration rounded to 10 µs. */
function ms(duration: number): number {
  return Math.round(duration * 100) / 100;
}

/** A scope's identity: its capture keys, unique and sorted; null (everything) stays null. */
function scopeKey(scope: EpisodeId[] | null): string | null {
  return scope === null ? null : [...new Set(scope.map(captureKey))].sort().join(",");
}

/**
 * The controller APIs' schema refuses such a scope; an in-process caller hands the request straight
 * to the engine. Refused before anything: nothing is journaled or sent, the checkpoint stays as it was.
 */
function refuseCommitScope(scope: EpisodeId[] | null): void {
  const issue = commitScopeIssue(scope);
  if (issue) throw new CheckpointError("invalid_request", issue);
}

/** What a retried commit must repeat: its scope (as a set) and stop flag. */
function commitArgs(scope: EpisodeId[] | null, stop: boolean): string {
  return canonicalJson([scopeKey(scope), stop]);
}

/**
 * What a retried publish or checkpoint must repeat of its controller state. An inline value is
 * written canonically on its own, then put in its place: inside the {inline} (and checkpoint's
 * array) its levels counted against canonicalJson's MAX_JSON_DEPTH, so a state as deep as the
 * controller API takes was refused (invalid_request) before anything ran.
 */
function controllerStateArgs(state: ControllerStateInput | ControllerState | null): string {
  return canonicalJson(state !== null && "inline" in state ? { ...state, inline: canonicalJson(state.inline ?? null) } : state);
}

function sameScope(a: EpisodeId[] | null, b: EpisodeId[] | null): boolean {
  return scopeKey(a) === scopeKey(b);
}

/** Whether checkpoint.json records the controller state an op names: the same inline JSON, or the same file (and sha256, if the op names one). */
function sameControllerState(recorded: ControllerState | null, requested: ControllerStateInput | null): boolean {
  if (recorded === null || requested === null) return recorded === requested;
  if ("inline" in requested) return "inline" in recorded && canonicalJson(recorded.inline) === canonicalJson(requested.inline ?? null);
  return "file" in recorded && recorded.file === requested.file && (requested.sha256 === undefined || requested.sha256 === recorded.sha256);
}
