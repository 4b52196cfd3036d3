import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { join, resolve } from "node:path";
import { trace, type Span } from "@opentelemetry/api";
import type { Logger } from "pino";
import {
  CheckpointError,
  ErrorReplySchema,
  MAX_CONTROLLER_STATE_FILE_BYTES,
  RunTrajectorySchema,
  TRAJECTORY_HEADER,
  FailureSpellLog,
  captureKey,
  finishedWithin,
  nextAttempt,
  redactUrl,
  sha256Hex,
  timerDelay,
  toCheckpointError,
  traceRecordFromTrajectory,
  type CtlReplyOf,
  type CtlRequestInputOf,
  type EpisodeId,
  type TraceRecord,
} from "../../protocol/index.js";
import { readCappedText } from "../../protocol/capped-body.js";
import { UNTIMED_DISPATCHER, UNTIMED_FETCH_DISPATCHER } from "../../protocol/untimed-dispatcher.js";
import { newCheckpointId } from "../engine/checkpoint-id.js";
import { AsyncLock } from "../engine/async-lock.js";
import { committedEpisodeIds } from "../publication/committed-records.js";
import { replaceFileDurably } from "../publication/durable-fs.js";
import { readRegularFileBytes } from "../publication/regular-file.js";
import { assertCheckpointVisible } from "./checkpoint-root.js";
import { markSpanFailed } from "../telemetry/coordinator-telemetry.js";
import { collectionInstruments, type RowCounts } from "./collection-telemetry.js";
import { COLLECTION_STATE_FILE, CollectionStateSchema, type CollectionState } from "./collection-state.js";
import { delay } from "./delay.js";
import { RefusalProbe } from "./refusal-probe.js";
import { neverSentCode, outOfDescriptors } from "../client/never-sent.js";
import { NetworkFailure, networkFailureCode } from "../client/network-failure.js";
import { DISPATCH_LOG_FILE, DispatchLog, type DispatchHistory, type LoggedAttempt } from "./dispatch-log.js";
import { OwnCheckpointOps, RESENT_CODES } from "./own-checkpoint-ops.js";
import { parseStateValue } from "./state-file-value.js";
import { ProgressReporter, progressClock, type ProgressSnapshot } from "./progress-reporter.js";
import { anotherCollection, collectionFields, collectionFlags, fromCollectionFields, sameCollection, samePath, type CollectionIdentity } from "./collection-identity.js";
import { appendResultText, createResultsIfAbsent, distrustedResults, readResults, readResultsForAppend, readResultsIfPresent, resultLineText, resultWritesEnded, resultWriteUnderWay, syncResults, type FinishedRow } from "./results-file.js";
import { RolloutRecordsSink, type RolloutRecordsOptions, type RolloutRecordsStats } from "./rollout-records-sink.js";
import { RowQueue } from "./row-queue.js";
import { assertConcurrencyFits } from "./scope-ceiling.js";
import { closeTaskRows, loadTask, type TaskRow } from "./task-rows.js";
import { MAX_RUN_REPLY_BYTES, parseRunReply, type RunReply } from "./run-reply.js";
import { RunTimeouts } from "./run-timeouts.js";
import { DEFAULT_RETRY_PAUSES, type RetryPauses } from "./retry-pauses.js";

/** The controller ops the collector needs; the NATS client and the in-process engine both fit. */
export interface CollectorController {
  prepare(request: CtlRequestInputOf<"prepare">): Promise<CtlReplyOf<"prepare">>;
  commit(request: CtlRequestInputOf<"commit">): Promise<CtlReplyOf<"commit">>;
  publish(request: CtlRequestInputOf<"publish">): Promise<CtlReplyOf<"publish">>;
  resume(request: CtlRequestInputOf<"resume">): Promise<CtlReplyOf<"resume">>;
  restore(request: CtlRequestInputOf<"restore">): Promise<CtlReplyOf<"restore">>;
  retire(request: CtlRequestInputOf<"retire">): Promise<CtlReplyOf<"retire">>;
  forget(request: CtlRequestInputOf<"forget">): Promise<CtlReplyOf<"forget">>;
  list(): Promise<CtlReplyOf<"list">>;
  status(): Promise<CtlReplyOf<"status">>;
  get(checkpointId: string): Promise<CtlReplyOf<"get">>;
}

export interface CollectorOptions {
  /** The rows to run, this collector's alone: a regular tasks file they are read from is closed when it ends (a failed start included), so another collector needs them read again. */
  rows: TaskRow[];
  /** POST <runUrl> with {rollout_id, attempt, task} runs one row (environment or legacy agent /run). */
  runUrl: string;
  outPath: string;
  /** --tasks and --rollout-id-prefix: with outPath, the collection the dispatch log's header names. */
  tasksPath?: string;
  rolloutIdPrefix?: string;
  /**
   * --new-collection: a dispatch log of another collection (or one not naming its collection) is
   * abandoned rather than refused (see Collector.abandon). This collection's own log is continued.
   */
  newCollection?: boolean;
  /**
   * The coordinator's checkpoint root as this host mounts it: checkpoints, LATEST, dispatched.jsonl
   * live here. Every file of a checkpoint is read and written through it, not through the
   * coordinator's path (its mount may differ).
   */
  checkpointDir: string;
  controller: CollectorController;
  concurrency?: number;
  /** Checkpoint on a timer while rows are in flight. */
  checkpointEverySeconds?: number;
  /** Deadline for each checkpoint op. */
  checkpointTimeoutSeconds?: number;
  /** Timeout of one /run. */
  runTimeoutSeconds?: number;
  /** Attempts per row before it counts as failed. */
  maxAttempts?: number;
  /** The largest `/run` reply body read (default MAX_RUN_REPLY_BYTES); past it the attempt fails `payload_too_large`. */
  maxRunReplyBytes?: number;
  /** The longest results.jsonl line written (MAX_RESULT_LINE_BYTES, what a start reads); smaller only in tests. */
  maxResultLineBytes?: number;
  progress?: ProgressReporter;
  logger: Logger;
  /** Also write finished rows as rollout records (asks `/run` for its trajectory). */
  records?: RolloutRecordsOptions;
  /** Pauses before sending again (default DEFAULT_RETRY_PAUSES); tests shorten them. */
  retryPauses?: Partial<RetryPauses>;
  /** Test-only fault injection (the CLI maps GYM_CKPT_TEST_CRASH_AT=after-restore onto it). */
  hooks?: { afterRestore?: () => void | Promise<void> };
}

export interface CollectionSummary {
  rows: number;
  finished: number;
  failed: number;
  checkpoints: number;
  continued: number;
  restarted: number;
  /** Usage the environment reported: calls/tokens kept by continuation vs generated again. */
  usage: { modelCallsKept: number; tokensKept: number; modelCallsRegenerated: number; tokensRegenerated: number };
  stopped: boolean;
  /** Rollout records written (when `records` is set). */
  records?: RolloutRecordsStats;
  /** The first FAILED_ROWS_LISTED rows that failed for good, each with why its last attempt failed. */
  failedRows: { rollout_id: string; reason: string }[];
}

/**
 * Whether a collection's log names no attempt but those its --out (`finished`) holds as finished:
 * such a collection ended (or will only ever end) as it is, so a new one may replace it without
 * --new-collection (abandoning it retires nothing).
 */
function everyAttemptFinished(history: DispatchHistory, finished: ReadonlyMap<string, { attempt: number }>): boolean {
  if (history.restoredOnly.size > 0) return false;
  for (const [id, attempt] of history.latest) if ((finished.get(id)?.attempt ?? -1) < attempt) return false;
  return true;
}

/** The refusal of a start that finds a checkpoint open that no run of this collection's left open. */
function anotherControllersCheckpoint(open: { checkpoint_id: string; phase: string }): CheckpointError {
  return new CheckpointError(
    "checkpoint_conflict",
    `checkpoint ${open.checkpoint_id} is open (${open.phase}) and this collector did not leave it open: another controller's, or left by a collector older than this one; let it finish, or resume it (gym-ckpt resume ${open.checkpoint_id}), then start again`,
  );
}

/** Failed rows the summary names: enough to see what went wrong, never the whole task file. */
const FAILED_ROWS_LISTED = 10;

interface RowState {
  row: TaskRow;
  attempt: number;
  status: "pending" | "inflight" | "done" | "failed";
  /** The row continues a restored checkpoint at `attempt` (not yet dispatched, or running). Set through queue.setRestored. */
  restored: boolean;
  /** Became a continuation at least once in this run (for the summary). */
  continued: boolean;
  failures: number;
  /** The failed attempt whose retire must finish before this row is sent again. */
  retiring?: number;
  /** When the retire this row waits for first failed (performance.now()); cleared once it succeeds. */
  retireFailingSince?: number;
  reply?: Promise<void>;
  /** The last send was refused admission (admission_closed): it runs nowhere until sent again. */
  refused: boolean;
  /** Woken when a send is refused admission (a checkpoint waiting for the row's reply stops waiting). */
  refusalWaiters: (() => void)[];
  /** Attempts refused `stale_attempt` (fenced, never started) and skipped without counting a failure. */
  fencedSkips: number;
  /**
   * Since when (performance.now(): a wall-clock step must neither fail the row early nor keep it
   * waiting past --run-timeout-s) every send of this attempt found no server at --run-url; cleared once one connects.
   */
  unreachableSince?: number;
  /** Since when (performance.now()) every reply to this row's sends was `storage_error`; cleared by any other reply. */
  storageRefusedSince?: number;
  /** After a `storage_error` reply, this row is not sent again before this (performance.now()). */
  storageHeldUntil?: number;
  /** Why its last attempt failed (for the summary of a row that failed for good). */
  lastFailure?: string;
}

/** Fenced attempts (`stale_attempt`) a row may skip before such a refusal counts as a failed attempt. */
const MAX_FENCED_SKIPS = 3;

const RETIRE_BATCH = 1024;
/**
 * Rows waiting for --run-url that one connection made (or /run reply: its socket is free again)
 * wakes while this collector is short of file descriptors: two, so a pool freed at once is taken up
 * in log2(rows waiting) round trips, while each costs at most two connects failing EMFILE again.
 */
const WOKEN_PER_CONNECTION_SHORT_OF_DESCRIPTORS = 2;

/**
 * Rollout collection with checkpoints: dispatches rows with bounded concurrency, appends results
 * as rows finish, checkpoints on demand (signal, timer) and, after a crash, continues restored
 * rows as attempt+1 while retiring and re-sending everything else it had dispatched.
 */
export class Collector {
  private readonly states = new Map<string, RowState>();
  /** Counts by status and the send order: nothing per dispatch or per finished row walks every row. */
  private queue = new RowQueue<RowState>();
  private readonly lock = new AsyncLock();
  private gateOpen = true;
  /** `/run` timeouts, paused while this collector's checkpoint keeps episodes parked. */
  private readonly runTimeouts = new RunTimeouts();
  /**
   * Since when (performance.now()) sends found no server at --run-url, and the first code in that
   * spell saying this collector had no file descriptor left (EMFILE, ENFILE); undefined while it answers.
   */
  private runUrlDown: { since: number; noDescriptor?: string } | undefined;
  /** --run-url as the logs show it: a key in its query (`?code=…`, which some gateways take) is not logged. */
  private readonly loggedRunUrl: string;
  private gateWaiters: (() => void)[] = [];
  private dispatchWaiters: (() => void)[] = [];
  private readonly toRetire: EpisodeId[] = [];
  /** Rollouts with a retired attempt; forgotten once a later attempt replies, and at close (as are continued rows once they reply). */
  private readonly retired = new Set<string>();
  /** Our checkpoints' ops, sent again while their outcome is unknown, and the resumes still unanswered. */
  private readonly ownOps: OwnCheckpointOps;
  private readonly toForget = new Set<string>();
  /** The checkpoint ids the log read at start names (this collection's, or the abandoned one's): see parkedForAnotherControllersStop. */
  private loggedCheckpoints: ReadonlySet<string> = new Set();
  private log!: DispatchLog;
  private runId = `run-${new Date().toISOString().replace(/[-:.TZ]/g, "").slice(0, 14)}-${randomBytes(4).toString("hex")}`;
  private checkpoints = 0;
  /** Rows earlier runs finished: the progress rate leaves them out. */
  private doneBefore = 0;
  private lastCheckpointAt: number | undefined;
  private stopping = false;
  /** halt() was called, or the collection failed (stopSending): no /run is sent or logged and no reply taken any more. */
  private halted = false;
  /**
   * Aborted by halt({ resumeCheckpoint }) (a SIGINT, a SIGHUP) and by a failed run(): a checkpoint
   * under way gives up where it is and is resumed, and none starts.
   */
  private readonly leaving = new AbortController();
  /**
   * Aborted, with the failure as its reason, by stopSending(): the collection failed. run() stops
   * waiting for its workers there, not once they are all back: a failed sync of --out (a records
   * step) stops the collection without any worker rejecting, and a worker its storage holds may
   * never come back, so they are given --run-timeout-s at most (drained).
   */
  private readonly collectionFailed = new AbortController();
  /**
   * Aborted by halt() once it stopped the collection (after resuming the checkpoint it gives up):
   * from then on run() waits --run-timeout-s at most for its workers (workersHeldPastHalt).
   */
  private readonly haltBegun = new AbortController();
  /** What run() rejects with when its workers were not all back --run-timeout-s after halt(). */
  private workersLeftAtHalt: CheckpointError | undefined;
  /**
   * Settles once the checkpoint under way (not a stop), or the start's restore, has been resumed:
   * halt({ resumeCheckpoint }) waits for it, since the exit after it closes NATS, and a prepared
   * checkpoint or a restore nobody resumes keeps the Gym parked (admission closed) until the
   * participants' lease expires.
   */
  private resumableCheckpoint: Promise<void> | undefined;
  /**
   * The workers are done (run() closes, or failed): a checkpoint asked for from now on (a SIGUSR1 or
   * SIGTERM during the summary) is skipped. It has nothing to save, and the process exits right
   * after, closing NATS: a prepare it sent would leave the Gym parked until the participants' lease.
   */
  private ended = false;
  /**
   * Aborted once the outcome is decided without waiting for the appends to --out still queued (a
   * failed run(), a halt, a last sync given up): those not begun never begin (giveUpAppends).
   */
  private readonly appendsGivenUp = new AbortController();
  /** Finished rows being appended to --out (and buffered as records): halt() waits for them. */
  private readonly finishing = new Set<Promise<void>>();
  /** A sync of --out failed: its last rows were cut off and the collection stops with this (see recordsPublishable). */
  private resultsLost: Error | undefined;
  /** With records: the rows appended to --out since the last good sync (cut off if the next one fails). */
  private readonly unsynced = new Set<string>();
  private restartedCount = 0;
  private readonly usage = { modelCallsKept: 0, tokensKept: 0, modelCallsRegenerated: 0, tokensRegenerated: 0 };
  private timer: NodeJS.Timeout | undefined;
  /** Checkpoints asked for and not finished: timer ticks skip while there is one. */
  private checkpointsPending = 0;
  /** Stop checkpoints asked for and not finished: any other checkpoint still waiting for the lock (timer, SIGUSR1) gives way. */
  private stopsPending = 0;
  private retireRetry: NodeJS.Timeout | undefined;
  /** Since when /run has answered admission_closed outside our checkpoints, and whether that was logged. */
  private admissionClosedSince: number | undefined;
  private admissionClosedWarned = false;
  /** Rows refused admission_closed outside our checkpoints: one is sent again (backing off), the others wait for it. */
  private readonly admission: RefusalProbe<RowState>;
  /** Rows that found no server at --run-url: one is sent again (backing off), the others wait for it (or their --run-timeout-s). */
  private readonly unreachable: RefusalProbe<RowState>;
  /** Rows waiting for a retire whose last try failed (for the progress line). */
  private retiresFailing = 0;
  /** A spell of failing retires (a Gym server down): one warning, not one per try. */
  private readonly retireFailures: FailureSpellLog;
  /** Spells of /run failing alike, by network failure code (logRunFailure); a /run's reply ends them. */
  private readonly runFailureSpells = new Map<string, FailureSpellLog>();
  /** A spell of /run answering `storage_error`; any other reply ends it. */
  private readonly storageRefusals: FailureSpellLog;
  private readonly instruments = collectionInstruments(() => this.rowCounts());
  private readonly records: RolloutRecordsSink | undefined;
  private readonly rowIndex = new Map<string, number>();
  private readonly pauses: RetryPauses;
  /** closeTasks() was called: the tasks file's descriptor is (being) closed. */
  private tasksClosed: Promise<void> | undefined;

  constructor(private readonly options: CollectorOptions) {
    this.pauses = { ...DEFAULT_RETRY_PAUSES, ...options.retryPauses };
    this.admission = new RefusalProbe(this.pauses.admissionClosedS, this.pauses.admissionClosedMaxS);
    this.unreachable = new RefusalProbe(this.pauses.unreachableS, this.pauses.unreachableMaxS);
    this.storageRefusals = new FailureSpellLog(options.logger, "/run answers without storage_error again");
    this.loggedRunUrl = redactUrl(options.runUrl);
    this.retireFailures = new FailureSpellLog(options.logger, "retires go through again");
    this.ownOps = new OwnCheckpointOps({
      controller: options.controller,
      logger: options.logger,
      lock: this.lock,
      deadline: () => this.deadline(),
      stopping: () => this.stopping,
      pauses: this.pauses,
    });
    // A step's rows are in --out (appended before their records are buffered): on disk before the
    // step is, or a power loss could keep the records and lose the rows, which would run again.
    this.records = options.records ? new RolloutRecordsSink(options.records, options.logger, (records) => this.recordsPublishable(records)) : undefined;
    options.rows.forEach((row, i) => this.rowIndex.set(row.rolloutId, i));
  }

  private rowCounts(): RowCounts {
    return { ...this.queue.counts };
  }

  private get logPath(): string {
    return join(this.options.checkpointDir, DISPATCH_LOG_FILE);
  }

  /** This collection, as its dispatch log's header names it. */
  private get identity(): CollectionIdentity {
    const { tasksPath, outPath, rolloutIdPrefix = "" } = this.options;
    return { ...(tasksPath !== undefined && { tasks: resolve(tasksPath) }), out: resolve(outPath), rolloutIdPrefix };
  }

  // ---- start-up: continue what the previous run left --------------------------------------

  /** Reads finished rows, the previous dispatch log and LATEST; restores or retires accordingly. */
  async start(): Promise<void> {
    try {
      await this.startUp();
    } catch (error) {
      await this.closeTasks(); // no run() follows a failed start
      throw error;
    }
  }

  private async startUp(): Promise<void> {
    // Before anything is read or written: a concurrency whose checkpoints could not carry their scope.
    assertConcurrencyFits(this.options.concurrency ?? 8, this.options.rows, "concurrency");
    // The log first, before anything is written (the records dir, a torn --out line cut): a log of
    // another collection is refused here, or abandoned with --new-collection, never continued.
    let history = await DispatchLog.read(this.logPath);
    /** The checkpoint ids an abandoned collection logged: carried, as a predecessor's are (one may still open). */
    let abandonedCheckpoints: Set<string> | undefined;
    if (history) {
      // A log older than the header naming its collection is continued (an upgrade
      // mid-run still resumes), unless the start says it begins a new collection.
      const own = history.collection ? await sameCollection(history.collection, this.identity) : !this.options.newCollection;
      // Another collection that finished every row it sent is replaced as with --new-collection:
      // abandoning it retires nothing.
      // Its --out read once, here and by abandon; unreadable or gone, whether it finished is not known: no.
      const earlierFinished = !own && !this.options.newCollection && history.collection ? await readResultsIfPresent(history.collection.out).catch(() => undefined) : undefined;
      const finishedBefore = earlierFinished !== undefined && everyAttemptFinished(history, earlierFinished);
      if (!own && !this.options.newCollection && !finishedBefore) throw anotherCollection(this.logPath, history.runId, history.collection!, this.identity);
      if (!own && history.collection && (await samePath(history.collection.out, this.identity.out))) {
        // Its finished rows would be taken for this collection's (row-1 … collide), rewards and all.
        throw new CheckpointError("invalid_request", `--out ${this.identity.out} holds the results of the earlier collection in this root (run ${history.runId}); a new collection needs an --out of its own`);
      }
      if (finishedBefore) this.options.logger.info({ run_id: history.runId, out: history.collection!.out }, "the earlier collection in this root finished every row it sent: starting a new one");
      if (!own) {
        await this.abandon(history, earlierFinished);
        abandonedCheckpoints = history.checkpoints;
        history = undefined;
      } else if (this.options.newCollection && history.collection) {
        this.options.logger.info({ run_id: history.runId }, "--new-collection: dispatched.jsonl is this collection's own (same --tasks, --out and --rollout-id-prefix); continuing it");
      }
    }
    await this.records?.start();
    const finished = await readResultsForAppend(this.options.outPath);
    this.queue = new RowQueue();
    for (const row of this.options.rows) {
      const done = finished.get(row.rolloutId);
      const state: RowState = { row, attempt: done?.attempt ?? 0, status: done ? "done" : "pending", restored: false, continued: false, failures: 0, refused: false, refusalWaiters: [], fencedSkips: 0 };
      this.states.set(row.rolloutId, state);
      this.queue.add(state);
    }
    this.doneBefore = this.queue.counts.done;
    const knownCheckpoints = history?.checkpoints ?? abandonedCheckpoints ?? new Set<string>();
    this.loggedCheckpoints = knownCheckpoints;
    const unfinished = new Map([...(history?.latest ?? [])].filter(([id]) => this.states.get(id)?.status === "pending"));
    const restoredOnly = history?.restoredOnly ?? new Set<string>();
    // Logged attempts of rollouts --tasks no longer names (edited since the crash) and --out does
    // not hold: no row sends them again, but one may still run at a surviving server, or be held
    // there as a restored attempt. Never restored; retired with the others below (at the attempt
    // logged, which a restored one is) and forgotten at the end, so nothing keeps them for good.
    const gone = new Map([...(history?.latest ?? [])].filter(([id]) => !this.states.has(id) && !finished.has(id)));
    if (gone.size) this.options.logger.warn({ rollouts: gone.size, first: [...gone.keys()].slice(0, 10) }, "dispatched.jsonl names rollouts --tasks no longer has; retiring their logged attempts");

    // Read-only until every op that can refuse (not leader yet, a busy coordinator) has answered:
    // a start-up that fails here leaves the log naming the previous run, so the retry still
    // finds that run's LATEST and continues its rows.
    // Reads: sent again when their reply was lost (the coordinator died with one in flight).
    const status = await this.ownOps.resent("start-up status", undefined, () => this.options.controller.status());
    const open = status.checkpoint;
    // A checkpoint our predecessor left open (it crashed mid-checkpoint) is closed first. The one
    // we are about to restore is left alone: the coordinator closes it itself, since a resume would
    // fence its id at the fresh participants.
    const collection = await this.latestCollection(history);
    // Our LATEST still open (a stop checkpoint, or a crash between publish and resume): only a
    // restore closes it at the coordinator, so it is restored even when no row continues from it
    // (an empty scope), and it refuses retires until then. Unless live Gym processes still hold it
    // parked: only fresh processes accept a restore, so it is resumed instead, and the rows it
    // would continue restart from input (their /runs died with our predecessor: nobody can read
    // their replies, and the live servers refuse the same attempt while it runs).
    // A restore (phase restored, or restoring while it is sent) is ours only when a start of ours sent it: a start restores only
    // the LATEST of the run it continues, and logs that run as continues_run before the restore. A
    // restore of any other checkpoint, the LATEST the logged run published itself or an older one
    // its log names, is another controller's (`gym-ckpt restore`), not a checkpoint we left open.
    const restore = open?.phase === "restored" || open?.phase === "restoring";
    const ours = open !== null && open.checkpoint_id === collection?.checkpoint_id && (!restore || collection.run_id === history?.continuesRun);
    // Only a checkpoint of ours is closed here: one the logged run started (logged before its
    // prepare; never restored by us unless it is that LATEST), or our LATEST. Any other is another
    // controller's, maybe mid-flight: a resume would abort it under that controller, and retires
    // are refused while it is open. Refused before anything is sent.
    if (open && !ours && (restore || !knownCheckpoints.has(open.checkpoint_id))) throw anotherControllersCheckpoint(open);
    const heldParked = ours && open.phase === "published" && heldBy(status.participants, open.checkpoint_id);
    // No log (lost, not abandoned): our own stop checkpoint, the Gym kept parked in it, told by its
    // collection.json. Nothing was sent after it, so its scope is every attempt that may still run:
    // retired once it is resumed, as a log naming them would have them, and their rows restarted.
    const ownStop = !history && !abandonedCheckpoints && !open ? await this.ownParkedStop(status.participants) : undefined;
    if (ownStop) {
      this.options.logger.warn({ checkpoint_id: ownStop.checkpoint_id, run_id: ownStop.run_id }, `${DISPATCH_LOG_FILE} is not there: resuming this collection's own stop checkpoint, which its collection.json names and the Gym is still parked in`);
      knownCheckpoints.add(ownStop.checkpoint_id);
      for (const e of [...ownStop.continued, ...ownStop.restarted]) {
        const state = this.states.get(e.rollout_id);
        if (state?.status === "pending") unfinished.set(e.rollout_id, e.attempt);
        else if (!state && !finished.has(e.rollout_id)) gone.set(e.rollout_id, e.attempt);
      }
      // The lost log, as far as collection.json tells (its run, the checkpoint, the attempts its scope
      // names), put back before the resume lets those attempts run on (there is no log to keep): a
      // start that fails or dies between the resume and their retire would otherwise leave nothing
      // naming them, and the next start, finding nothing parked, would send them again beside the
      // attempts resumed. With it, the next start goes on as with the log never lost.
      const named = [...unfinished, ...gone].map(([rollout_id, attempt]) => ({ rollout_id, attempt }));
      await DispatchLog.create(this.logPath, ownStop.run_id, named, undefined, knownCheckpoints, this.identity);
    }
    // Our LATEST closed at the coordinator, its resume failed at a live process still parked in it
    // (the checkpoint op's resume_failures), or our stop checkpoint its Gym is kept parked in: the
    // coordinator refuses its restore (invalid_phase) and that process every retire until it is
    // resumed. Resumed here, its rows restarted, as above.
    const heldClosed = open ? undefined : collection !== undefined && heldBy(status.participants, collection.checkpoint_id) ? collection : ownStop;
    const restorable = heldParked || heldClosed ? [] : (collection?.continued ?? []);
    const continued = new Map(restorable.filter((e) => unfinished.get(e.rollout_id) === e.attempt).map((e) => [e.rollout_id, e]));
    // Our restore left open with some of its attempts logged as restored: it landed, and the start
    // that sent it was killed while logging them (a large batch is appended in several writes). The
    // rest were installed too: logged as restored now, all resumed and sent, not restored again
    // with a smaller scope (refused while that restore is open, which would then stay open). So too
    // when its scope named a rollout gone from --tasks: its attempt+1, installed, is retired.
    const loggedRestored = (e: EpisodeId) => restoredOnly.has(e.rollout_id) && (unfinished.get(e.rollout_id) ?? gone.get(e.rollout_id)) === e.attempt + 1;
    if (ours && open.phase === "restored" && restorable.some((e) => loggedRestored(e) || gone.get(e.rollout_id) === e.attempt)) {
      for (const e of continued.values()) {
        unfinished.set(e.rollout_id, e.attempt + 1);
        restoredOnly.add(e.rollout_id);
      }
      continued.clear();
      for (const e of restorable) if (gone.get(e.rollout_id) === e.attempt) gone.set(e.rollout_id, e.attempt + 1);
    }
    // Our restore of it left open (the previous start died before resuming it): sent again with the
    // same scope while its rows are still logged at their source attempts (it died before the
    // reply, and the retry gets it); resumed when the restored attempts were logged, which are sent.
    const restoreCloses = ours && !heldParked && (open.phase !== "restored" || continued.size > 0);
    /** The restore left open had failed: its clean-up fenced the attempts it had installed. */
    let restoreFailed = false;
    if (open && !restoreCloses) {
      this.options.logger.info({ checkpoint_id: open.checkpoint_id, phase: open.phase, held_parked: heldParked }, "closing the checkpoint a previous run left open");
      restoreFailed = await this.resumeLeftOpen(open.checkpoint_id);
    } else if (heldClosed) {
      this.options.logger.info({ checkpoint_id: heldClosed.checkpoint_id }, "resuming the checkpoint live processes still hold parked (its resume failed there, or a stop kept its Gym)");
      await this.resumeLeftOpen(heldClosed.checkpoint_id);
    }

    // Every other unfinished logged attempt may still run somewhere: retire it, send attempt+1.
    // An attempt that was only restored never ran: retire the one before and send it again, so a
    // participant still holding its restored record continues it.
    const stale = [...unfinished]
      .filter(([id]) => !continued.has(id))
      .map(([rollout_id, attempt]) => ({ rollout_id, attempt: restoredOnly.has(rollout_id) ? attempt - 1 : attempt }));
    const retiring = [...stale, ...[...gone].map(([rollout_id, attempt]) => ({ rollout_id, attempt }))];
    // Retiring changes no log: the previous one still names these attempts if this start fails.
    if (retiring.length && !restoreCloses) await this.retireAtStart(retiring);
    // Rows the logged run finished as a later attempt (after a retire, a fenced skip or a restore):
    // the forget that lifts their fences was queued in memory and may have died with it. Sent again
    // now (once more is harmless) while nothing is open; those not sent (our LATEST is open until the
    // restore below closes it, or the forget failed) are carried into the new log, so a crash before
    // they get out still finds them, and sent once started.
    const unforgotten = [...(history?.latest.keys() ?? [])].filter((id) => {
      const state = this.states.get(id);
      return state?.status === "done" && state.attempt > 0;
    });
    for (const id of unforgotten) this.toForget.add(id);
    if (!restoreCloses) {
      await this.forgetQueued().catch((err: unknown) => this.options.logger.warn({ err, rollouts: this.toForget.size }, "forget of finished rollouts failed; carried in the log and tried again"));
    }
    // Carried forward before anything is restored or sent, so a crash from now on still fences them.
    // A restore of another run's checkpoint names that run: killed before the restore landed, the
    // next start still finds the checkpoint open and restores it (see latestCollection).
    const restoring = collection && (continued.size || restoreCloses) ? collection : undefined;
    const carried: LoggedAttempt[] = [
      ...[...unfinished].map(([rollout_id, attempt]) => ({ rollout_id, attempt, ...(restoredOnly.has(rollout_id) && { restored: true as const }) })),
      ...[...this.toForget].map((rollout_id) => ({ rollout_id, attempt: this.states.get(rollout_id)!.attempt })),
      // Gone rollouts still to retire (after the restore below): a crash before then still finds them.
      ...(restoreCloses ? [...gone].map(([rollout_id, attempt]) => ({ rollout_id, attempt, ...(restoredOnly.has(rollout_id) && { restored: true as const }) })) : []),
    ];
    // The checkpoint ids the old log names are carried too: the status read above may have missed
    // one whose prepare still waited at the coordinator (behind another op), and it may open once
    // the old log is gone. Without them the next start would refuse its own predecessor's checkpoint.
    this.log = await DispatchLog.create(this.logPath, this.runId, carried, restoring && restoring.run_id !== this.runId ? restoring.run_id : undefined, knownCheckpoints, this.identity);
    // An attempt only restored is still held by the processes the restore installed it at (no
    // restore of ours replaces them, nor did its clean-up fence it): it continues, so it stays in the
    // scope of a checkpoint taken before it is sent, which would otherwise drop the record.
    let continuedRestored = 0;
    for (const episode of stale) {
      const state = this.states.get(episode.rollout_id)!;
      state.attempt = episode.attempt + 1;
      if (restoredOnly.has(episode.rollout_id) && !restoreCloses && !restoreFailed) {
        state.continued = true;
        this.queue.setRestored(state, true);
        this.queue.sendFirst(state);
        continuedRestored++;
      } else {
        this.restartedCount++;
      }
    }
    if (restoring) await this.restoreRows(restoring, [...continued.values()], carried);
    if (retiring.length && restoreCloses) await this.retireAtStart(retiring);
    if (this.toForget.size) this.forgetSoon();
    this.instruments.rows.add(this.restartedCount, { outcome: "restarted" });
    this.instruments.rows.add(continuedRestored, { outcome: "continued" });
  }

  /**
   * --new-collection over the log of another collection (or one that does not name its
   * collection): that collection ends as its own end would have left the Gym, without anything of
   * it continuing. A checkpoint it left open is closed (resumed); the attempts it left unfinished by
   * its own --out (which its log names) are retired, so the Gym stops and frees them, and forgotten,
   * with the rows it finished as a later attempt (their forget may have died with it); its finished
   * rows are not retired, so their model ledgers stay, and nothing of it is restored. When its --out
   * cannot be told (gone, or not named by an older log), only attempts that certainly never
   * finished are retired: one only restored, never sent, and those of a restore it left open; the
   * others are said, not retired (a finished row's retire would delete its ledger). Writes nothing:
   * a start that fails after this leaves the old log, and the next start abandons it again (retire
   * and forget are idempotent).
   */
  private async abandon(history: DispatchHistory, finishedOut?: Map<string, FinishedRow>): Promise<void> {
    const earlier = history.collection;
    // Before anything is resumed or retired, as at any start: a --checkpoint-dir that is not this
    // coordinator's root holds another coordinator's log, whose rollout ids (row-1, …) may name
    // live rollouts of another collection here.
    await this.visibleLatest();
    const earlierFinished = finishedOut ?? (earlier ? await readResultsIfPresent(earlier.out) : undefined);
    this.loggedCheckpoints = history.checkpoints;
    const status = await this.ownOps.resent("start-up status", undefined, () => this.options.controller.status());
    const open = status.checkpoint;
    /** Rollouts a restore it left open may have installed at attempt + 1: never sent since. */
    const restoredScope = new Set<string>();
    if (open) {
      // Its own only as for a restart (see start): another controller's checkpoint is refused.
      const collection = await this.latestCollection(history);
      const restore = open.phase === "restored" || open.phase === "restoring";
      const latestOurs = open.checkpoint_id === collection?.checkpoint_id && (!restore || collection.run_id === history.continuesRun);
      if (!latestOurs && (restore || !history.checkpoints.has(open.checkpoint_id))) throw anotherControllersCheckpoint(open);
      if (restore) for (const e of collection!.continued) if (history.latest.get(e.rollout_id) === e.attempt) restoredScope.add(e.rollout_id);
      this.options.logger.info({ checkpoint_id: open.checkpoint_id, phase: open.phase }, "new collection: closing the checkpoint the earlier collection left open");
      await this.resumeLeftOpen(open.checkpoint_id);
    }
    const certainlyUnfinished = (id: string) => history.restoredOnly.has(id) || restoredScope.has(id);
    const retiring: EpisodeId[] = [];
    let unknown = 0;
    for (const [rollout_id, attempt] of history.latest) {
      if (earlierFinished ? earlierFinished.has(rollout_id) : !certainlyUnfinished(rollout_id)) {
        if (!earlierFinished) unknown++;
        continue;
      }
      retiring.push({ rollout_id, attempt: restoredScope.has(rollout_id) ? attempt + 1 : attempt });
    }
    if (retiring.length) await this.retireAtStart(retiring);
    // Lifted once retired, as at a collection's end: a later collection reusing these ids is not refused.
    const forgetting = new Set(retiring.map((e) => e.rollout_id));
    for (const [id, row] of earlierFinished ?? []) if (row.attempt > 0 && history.latest.has(id)) forgetting.add(id);
    const ids = [...forgetting];
    for (let i = 0; i < ids.length; i += RETIRE_BATCH) {
      const batch = ids.slice(i, i + RETIRE_BATCH);
      await this.ownOps.resent("forget", undefined, () => this.options.controller.forget({ rollout_ids: batch, deadline_ts: this.deadline() }));
    }
    const about = { run_id: history.runId, ...(earlier && { tasks: earlier.tasks, out: earlier.out }), retired: retiring.length, forgotten: ids.length };
    if (unknown) {
      this.options.logger.warn(
        { ...about, not_retired: unknown },
        `new collection: abandoned the earlier collection; its --out ${earlier ? `${earlier.out} is not there` : "is not named by its log (written by an older collector)"}, so which of its rows finished is unknown: ${unknown} logged attempts are not retired (a finished row's retire would delete its model ledger); one still running at a Gym server is not stopped (gym-ckpt retire stops it)`,
      );
    } else {
      this.options.logger[retiring.length ? "warn" : "info"](about, "new collection: abandoned the earlier collection: its unfinished attempts retired, its finished rows left alone");
    }
  }

  /**
   * Resumes the checkpoint a crashed predecessor left open. Its op may still run at the coordinator
   * (a prepare waiting on a participant that died with it, until that op's deadline plus slack), and
   * ops run there one at a time: a resume whose deadline passed while it waited is sent again.
   * True when it was a restore that had failed (its clean-up fenced what it installed).
   */
  private async resumeLeftOpen(checkpointId: string): Promise<boolean> {
    try {
      await this.ownOps.resumeSent("resume of the previous run's checkpoint", checkpointId);
      return false;
    } catch (error) {
      // A participant that did not answer the resume (its process down: a Gym restarting beside
      // us, as after a node's crash) holds nothing parked, or resumes by itself when its lease
      // expires; the coordinator closed the checkpoint all the same. Not a reason to stop.
      if (error instanceof CheckpointError && error.code === "unreachable") {
        this.options.logger.warn({ checkpoint_id: checkpointId, err: error }, "the checkpoint the previous run left open is closed; participants that did not answer its resume resume when their lease expires");
        return false;
      }
      // A restore our predecessor left open whose processes restarted since: the coordinator ran
      // its clean-up (retired attempt+1 where it may be installed, resumed everyone). Closed, then;
      // the rows restart from input, and an attempt that clean-up fenced is skipped when sent.
      if (!(error instanceof CheckpointError && error.code === "restore_failed")) throw error;
      this.options.logger.info({ checkpoint_id: checkpointId, err: error }, "the restore the previous run left open had failed; its clean-up closed it");
      return true;
    }
  }

  /**
   * The resume of a restore answered `restore_failed`: the coordinator sends its clean-up's resume
   * again where it still failed (a participant off NATS past the clean-up's deadline, parked in the
   * restore: it refuses our retire of attempt+1, `checkpoint_conflict`, and every prepare) and
   * answers `restore_failed` again; where nothing failed it sends nothing. Not a reason to stop:
   * one still unreachable resumes when its lease expires.
   */
  private async resumeCleanedUp(checkpointId: string): Promise<void> {
    try {
      await this.ownOps.resumeSent("resume of the failed restore", checkpointId);
    } catch (error) {
      if (error instanceof CheckpointError && error.code === "restore_failed") return;
      this.options.logger.warn({ checkpoint_id: checkpointId, err: error }, "the resume of the failed restore failed; a participant still parked in it resumes when its lease expires");
    }
  }

  /**
   * Restores the continued rows as attempt+1; if the restore fails they start over as attempt+2.
   * An unknown outcome is not a failure: the coordinator's successor re-drives a journaled restore
   * and answers its retry (same id and scope) with the original reply, and a resume of a closed id
   * is idempotent. Abandoning it would leave the restore open (admission closed, participants
   * parked until their lease expires) and throw the continuation away. `carried` is what the log
   * was started with.
   */
  private async restoreRows(collection: CollectionState, sources: EpisodeId[], carried: LoggedAttempt[]): Promise<void> {
    const checkpointId = collection.checkpoint_id;
    const attributes = { "gym_ckpt.checkpoint.id": checkpointId, "gym_ckpt.rows": sources.length };
    await tracer().startActiveSpan("checkpoint.collection.restore", { attributes }, async (span) => {
      let restored = false;
      /** A try was answered otherwise than not_leader (which promises it never ran): it may have installed attempt+1. */
      let ranMaybe = false;
      // A SIGINT meanwhile waits for its resume: the exit closes NATS, and a restore left open keeps
      // every participant parked until its lease expires (the next start would close it, if any).
      const resumed = this.resumable();
      try {
        // With deadlines, like every other op: a try that meets a failover is answered (or given up)
        // within --checkpoint-timeout-s, not the client's 90 s default, while everyone stays parked.
        await this.ownOps.resent("restore", checkpointId, () =>
          this.options.controller.restore({ checkpoint_id: checkpointId, episode_ids: sources, deadline_ts: this.deadline() }).catch((error: unknown) => {
            if (!(error instanceof CheckpointError && error.code === "not_leader")) ranMaybe = true;
            throw error;
          }),
        );
        restored = true;
        // Logged before anything relies on it: a checkpoint taken before these rows are sent
        // continues them as attempt+1, which the next start must find in the log. Before the
        // resume: a start after a crash here must not restore the checkpoint again (once resumed,
        // the processes refuse it) but resume it and send attempt+1.
        await this.log.recordRestored(sources.map(nextAttempt));
        await this.ownOps.resumeSent("resume of the restored checkpoint", checkpointId);
        resumed();
        for (const source of sources) {
          const state = this.states.get(source.rollout_id)!;
          Object.assign(state, { attempt: source.attempt + 1, continued: true });
          this.queue.setRestored(state, true);
          this.queue.sendFirst(state);
        }
        this.instruments.rows.add(sources.length, { outcome: "continued" });
        this.options.logger.info({ checkpoint_id: collection.checkpoint_id, rows: sources.length }, "restored checkpoint; continuing rows as their next attempt");
        await this.options.hooks?.afterRestore?.();
      } catch (error) {
        resumed(); // closed by the coordinator's clean-up, never opened, or its resume remembered below
        // After restore_failed the coordinator has retired attempt+1 wherever the restore may have
        // installed it and resumed; after a refusal from every participant (e.g. stale_checkpoint:
        // the surviving processes already resumed from it) nothing was installed or cleaned up;
        // after the tries ran out with the outcome unknown, attempt+1 may still be installed. The
        // source attempts may still run on servers that survived. Retiring attempt+1 everywhere
        // fences both (a retire fences every attempt up to the one named); then those rows start
        // over as attempt+2.
        markSpanFailed(span, error);
        // Refused not_leader on every try (no leader that long; over HTTP, a coordinator still
        // becoming leader answers it at once): it never ran, so nothing is installed or to clean up.
        // The start fails like one refused before it; the log still names the source attempts and
        // the run they continue, so the next start restores the same checkpoint.
        if (!restored && !ranMaybe) throw error;
        this.options.logger.warn({ checkpoint_id: checkpointId, err: error, rows: sources.length }, "restore failed; restarting those rows from input");
        if (error instanceof CheckpointError && RESENT_CODES.has(error.code)) {
          // The restore (or its resume) may have landed and never got an answer: a successor
          // re-drives the journaled restore and keeps it open (every participant parked) for this
          // resume, which nothing else would send. Not open there: the resume answers not_found.
          this.ownOps.rememberUnresumed(checkpointId);
        }
        // Logged first: after a crash from here on, the next start must send attempt+2, not the
        // fenced attempt+1 that every participant refuses. Every row at once (the log rewritten, not
        // appended to: a large append is written in pieces): a crash part way would leave the rest at
        // their source attempts, which the next start would restore again with a smaller scope, one
        // a restore left open (outcome unknown) refuses, so it would stay open, everyone parked.
        const replacements = sources.map(nextAttempt);
        const replaced = new Set(sources.map((s) => s.rollout_id));
        await this.log.replace([...carried.filter((e) => !replaced.has(e.rollout_id)), ...replacements]);
        if (error instanceof CheckpointError && error.code === "restore_failed") await this.resumeCleanedUp(checkpointId);
        await this.retireAtStart(replacements);
        for (const source of sources) {
          this.states.get(source.rollout_id)!.attempt = source.attempt + 2;
          this.retired.add(source.rollout_id);
          this.restartedCount++;
        }
      } finally {
        resumed();
        span.setAttribute("gym_ckpt.restarts", this.restartedCount);
        span.end();
      }
    });
  }

  /**
   * The coordinator's LATEST checkpoint id, once it is seen in --checkpoint-dir. Also without a log:
   * a --checkpoint-dir that is not the coordinator's root is refused before this run writes
   * anything, not at its first checkpoint.
   */
  private async visibleLatest(): Promise<string | null> {
    const { latest, latest_error: damaged } = await this.ownOps.resent("start-up list", undefined, () => this.options.controller.list());
    // A damaged LATEST is no "nothing published": starting over would lose the collection state an
    // older checkpoint holds, and the first checkpoint would move LATEST past it. Refused as `list` did.
    if (damaged) throw new CheckpointError(damaged.code, `LATEST is damaged: ${damaged.detail}; restore an older checkpoint or repair LATEST (gym-ckpt ls, gym-ckpt verify)`);
    if (latest) await assertCheckpointVisible(this.options.checkpointDir, latest);
    return latest;
  }

  /**
   * The LATEST checkpoint's collection state, only when it belongs to the logged run or to the run
   * that one started by restoring (`continues_run`): killed before its restore's reply, the logged
   * run still names those rows at their source attempts, and they are restored again.
   */
  private async latestCollection(history: DispatchHistory | undefined): Promise<CollectionState | undefined> {
    const latest = await this.visibleLatest();
    if (!latest || !history) return undefined;
    const runId = history.runId;
    const { manifest } = await this.ownOps.resent("start-up get", latest, () => this.options.controller.get(latest));
    const state = await this.collectionStateOf(latest, manifest);
    if (state && state.run_id !== runId && state.run_id !== history.continuesRun) {
      this.options.logger.info({ latest, latest_run: state.run_id, logged_run: runId }, "LATEST belongs to another run; restoring nothing");
      return undefined;
    }
    return state;
  }

  /**
   * dispatched.jsonl lost (deleted, its directory wiped): nothing names the checkpoints this
   * collection took. Its own published stop checkpoint, closed at the coordinator by its publish
   * while the Gym it kept stays parked in it, looked like another controller's: nothing resumed it,
   * and every /run was refused admission until a `gym-ckpt resume` by hand. So LATEST, when live
   * processes hold it parked and it is a stop checkpoint, is ours when its collection.json names
   * this collection (the test the log's header gets). Any other (another collection's, a file
   * written before it named its collection, another controller's state) is left for its controller
   * to stop, with a warning naming it and the resume to run should it be this collection's after all.
   */
  private async ownParkedStop(participants: CtlReplyOf<"status">["participants"]): Promise<CollectionState | undefined> {
    // Nothing held anywhere (the usual first start): no op sent for it.
    if (!participants.some((p) => p.checkpoint_id && p.phase !== null && p.phase !== "idle")) return undefined;
    const latest = await this.visibleLatest();
    if (!latest || !heldBy(participants, latest)) return undefined;
    const { manifest } = await this.ownOps.resent("start-up get", latest, () => this.options.controller.get(latest));
    if (!manifest.stop) return undefined;
    const statePath = join(this.options.checkpointDir, latest, COLLECTION_STATE_FILE);
    const state = await this.collectionStateOf(latest, manifest).catch((error: unknown) => {
      if (!(error instanceof CheckpointError && error.code === "invalid_checkpoint_state")) throw error;
      throw damagedParkedStop(latest, statePath, join(this.options.checkpointDir, latest, "checkpoint.json"), error);
    });
    if (state?.collection && (await sameCollection(fromCollectionFields(state.collection), this.identity))) return state;
    this.options.logger.warn(
      { checkpoint_id: latest, ...(state?.collection && { its_collection: collectionFlags(fromCollectionFields(state.collection)) }) },
      parkedStopWarning(latest, state, statePath),
    );
    return undefined;
  }

  /** The collection.json of LATEST (`latest`, `manifest` from its get); undefined when its controller state is not a collection's. */
  private async collectionStateOf(latest: string, manifest: CtlReplyOf<"get">["manifest"]): Promise<CollectionState | undefined> {
    const ref = manifest.controller_state;
    if (!ref || !("file" in ref)) return undefined;
    // Another controller's state file (`gym-ckpt checkpoint --state-file`, a trainer's): LATEST is
    // not a collection's, so nothing continues from it, as for another run's.
    if (ref.file !== COLLECTION_STATE_FILE) {
      this.options.logger.info({ latest, state_file: ref.file }, "LATEST holds another controller's state; restoring nothing");
      return undefined;
    }
    // As publication hashed it: a regular file in the checkpoint, no link out of it, bounded.
    const path = join(this.options.checkpointDir, latest, ref.file);
    const bytes = await readRegularFileBytes(path, { maxBytes: MAX_CONTROLLER_STATE_FILE_BYTES, noFollow: true }).catch((error: unknown) => {
      if ((error as NodeJS.ErrnoException).code !== "ENOENT") throw error;
      throw new CheckpointError("invalid_checkpoint_state", `${ref.file} of LATEST checkpoint ${latest} is missing: ${path} does not exist`);
    });
    // Hashed as stored: decoding first maps invalid UTF-8 to U+FFFD, so damaged bytes could hash alike.
    if (sha256Hex(bytes) !== ref.sha256) throw new CheckpointError("invalid_checkpoint_state", `${ref.file} of ${latest} does not match its digest`);
    return parseStateValue(CollectionStateSchema, bytes.toString("utf8"), join(latest, ref.file));
  }

  // ---- the dispatch loop -----------------------------------------------------------------

  async run(): Promise<CollectionSummary> {
    this.options.progress?.start(() => this.progressSnapshot());
    // No more workers than rows left to run: a worker per unit of a huge --concurrency (say 1e9,
    // meaning "no limit") would exhaust memory or the array length before any row is sent.
    const concurrency = Math.min(this.options.concurrency ?? 8, this.queue.counts.pending);
    if (this.options.checkpointEverySeconds) {
      this.timer = setInterval(() => {
        // A tick while a checkpoint runs or waits is skipped: queued ones would run back to back.
        if (this.inFlight() > 0 && !this.stopping && this.checkpointsPending === 0) {
          void this.checkpoint({ stop: false }).catch((err: unknown) => this.options.logger.debug({ err }, "timer checkpoint failed"));
        }
      }, timerDelay(this.options.checkpointEverySeconds * 1000));
      this.timer.unref();
    }
    // A /run replies once its rollout ends: the connection made is what says --run-url is back.
    const runOrigin = new URL(this.options.runUrl).origin;
    const connected = (origin: URL | string) => {
      if (new URL(String(origin)).origin === runOrigin) this.runUrlBack(this.unreachable.sending());
    };
    UNTIMED_DISPATCHER.on("connect", connected);
    let workers: Promise<void>[] = [];
    const workersWaitEnded = new AbortController();
    try {
      // Before the first /run: a --new-collection after this one tells by it that no row finished yet.
      await createResultsIfAbsent(this.options.outPath);
      // A worker that fails (results.jsonl cannot be appended) stops the others at once, before its
      // rejection reaches this catch: start no other row and drop the /runs in flight, whose results
      // could not be kept either (they are logged: the next start retires them).
      workers = Array.from({ length: concurrency }, () =>
        this.worker().catch((error: unknown) => {
          this.stopSending(error);
          throw error;
        }),
      );
      await Promise.race([Promise.all(workers), rejectedOnAbort(this.collectionFailed.signal), this.workersHeldPastHalt(workersWaitEnded.signal)]);
      if (this.resultsLost) throw this.resultsLost;
    } catch (error) {
      this.ended = true;
      this.stopSending(error);
      this.ownOps.end();
      clearTimeout(this.retireRetry);
      // Our checkpoint under way (timer, SIGUSR1, a SIGTERM's stop) is given up and resumed, as on a
      // SIGINT: nothing may be committed, published or resumed once the failure is out.
      this.leaving.abort();
      if (error === this.workersLeftAtHalt) {
        // Halted: halt() waited (bounded) for the appends and the tasks file's close, and its
        // caller's flushRecords() writes the records; waiting here again would wait on the storage
        // that holds the workers. A line queued behind the held one never lands after this.
        this.giveUpAppends("the collector stopped before this line's turn");
        this.options.progress?.finish();
        throw error;
      }
      // Every worker comes back, and our checkpoint, retires and forgets under way end, before
      // run() rejects, so nothing is logged or sent once it has (its caller releases the lock and
      // exits). Bounded: a worker held by storage that hangs (a task line or dispatched.jsonl on a
      // dead mount), or an op the controller does not answer, does not hold the failure for ever.
      const back = await this.drained(workers);
      // Decided: an append still queued (behind one its storage holds) never lands after it.
      this.giveUpAppends("the collection failed before this line's turn");
      // The rows already in --out are never run again: their buffered records are written now (or
      // counted unwritten), the appends still under way having ended (drained). Bounded: the flush
      // syncs --out first, which on a mount that hangs never ends.
      await this.closeRecordsWithin().catch(() => undefined);
      // Closing the tasks file waits for the reads under way (FileHandle.close): with a worker given
      // up in one, not waited for. It closes once that read ends, and the worker then sends nothing.
      if (back) await this.closeTasks();
      else void this.closeTasks();
      this.options.progress?.finish(); // the error is printed next
      throw error;
    } finally {
      workersWaitEnded.abort();
      UNTIMED_DISPATCHER.off("connect", connected);
    }
    this.ended = true;
    if (this.timer) clearInterval(this.timer);
    clearTimeout(this.retireRetry);
    // Every row is done, failed for good, or stopped: none is sent again. Storage that hangs (a dead
    // mount) holds none of the closes below for good: each is waited for at most --run-timeout-s,
    // as on a failure or a halt.
    if (!(await finishedWithin(this.closeTasks(), this.runTimeoutMs))) {
      this.options.logger.warn({ wait_s: this.runTimeoutMs / 1000 }, "the tasks file's close did not end within --run-timeout-s as the collection ends (its storage hangs?); going on without it");
    }
    if (!this.stopping) await this.close();
    this.ownOps.end();
    await this.closeRecordsWithin();
    await this.syncFinishedResults();
    this.options.progress?.finish();
    // The last step's sync failed: rows the summary would count are no longer in --out.
    if (this.resultsLost) throw this.resultsLost;
    this.report(true);
    return this.summary();
  }

  /**
   * Syncs --out before a records step is published, and answers which of its records may be. A
   * failed fdatasync cannot be tried again (a sync on a new descriptor would succeed without the
   * lines being on disk): results-file cuts off the lines since the last good sync, and the
   * collection stops (`storage_error`, exit 1) rather than count those rows finished. Their
   * attempts are in the dispatch log, so the next start retires them and runs them again; their
   * records are dropped, while those of the rows the last good sync covered are still published.
   */
  private async recordsPublishable(records: TraceRecord[]): Promise<TraceRecord[]> {
    const out = this.options.outPath;
    if (!this.resultsLost) {
      // The rows appended so far: the sync is queued behind their appends.
      const covered = [...this.unsynced];
      try {
        await syncResults(out);
        for (const id of covered) this.unsynced.delete(id);
        return records;
      } catch (error) {
        const lost = distrustedResults(out);
        if (!lost) throw error; // nothing synced, nothing failed to sync (say --out could not be opened): tried again
        this.loseResults(lost.failure);
      }
    }
    // What the last good sync covered is on disk, and nothing after it is in --out any more.
    if (!distrustedResults(out)?.cut) throw this.resultsLost;
    return records.filter((r) => !this.unsynced.has(String(r.info?.["rollout_id"])));
  }

  /**
   * The collection ends: --out goes on disk before the summary says so (a trainer reads it once we
   * exit, and nothing would run its rows again). Without --records-dir nothing synced it so far. A
   * failure is final, as one before a records step is (recordsPublishable): the rows since the last good sync are cut off.
   */
  private async syncFinishedResults(): Promise<void> {
    if (this.resultsLost || !existsSync(this.options.outPath)) return;
    try {
      // Bounded (a dead mount): not known on disk, its rows are not counted finished; nothing is cut
      // (the lines read back, and the next start's own sync tells).
      if (!(await finishedWithin(syncResults(this.options.outPath), this.runTimeoutMs))) {
        const wait_s = this.runTimeoutMs / 1000;
        this.resultsLost = new CheckpointError("storage_error", `${this.options.outPath}: its sync as the collection ends did not end within --run-timeout-s (${wait_s} s): its rows may not be on disk`);
        this.giveUpAppends("the collection ended without its last sync");
        this.options.logger.error({ wait_s, out: this.options.outPath }, "results.jsonl's sync as the collection ends did not end within --run-timeout-s (its storage hangs?); failing without it: the next start syncs it again");
        return;
      }
      this.unsynced.clear();
    } catch (error) {
      const distrusted = distrustedResults(this.options.outPath);
      this.resultsLost = distrusted?.failure ?? toCheckpointError(error);
      this.options.logger.error(
        { err: this.resultsLost },
        distrusted ? "results.jsonl could not be synced as the collection ends; the rows cut from it run again at the next start" : "results.jsonl could not be opened to sync it as the collection ends; its rows may not be on disk",
      );
    }
  }

  private loseResults(error: Error): void {
    this.resultsLost = error;
    this.options.logger.error({ err: error }, "results.jsonl could not be synced; the collection stops, and the rows cut from it run again at the next start");
    // As after a failed append: nothing more is sent, and the /runs in flight are dropped (their
    // lines could not be kept either; the next start retires them).
    this.stopSending(error);
  }

  /**
   * The collection failed: no row is sent or logged any more and no reply is taken (halted), the
   * /runs in flight are aborted, and every worker parked (for rows, for our checkpoint to end, for
   * --run-url or admission) wakes to see it and comes back. `failure` is what run() rejects with
   * (the first one given).
   */
  private stopSending(failure: unknown): void {
    this.collectionFailed.abort(failure);
    this.halted = true;
    this.stopping = true;
    this.runTimeouts.abortAll();
    clearInterval(this.timer);
    this.wakeDispatchers();
    for (const wake of this.gateWaiters.splice(0)) wake();
    this.admission.wakeAll();
    this.unreachable.wakeAll();
  }

  /**
   * Rejects (storage_error) once run()'s workers are not all back --run-timeout-s after halt() and
   * no /run is in flight: then only storage that hangs holds one (a results.jsonl line's write, a
   * task line read, a dispatched.jsonl append), and a controller embedding the collector awaits
   * run(). While a /run is in flight (it ends by its own timeout) the bound starts again. Never
   * settles once `until` aborts (run() stopped waiting for them).
   */
  private workersHeldPastHalt(until: AbortSignal): Promise<never> {
    return new Promise<never>((_, reject) => {
      const bound = () =>
        void delay(this.runTimeoutMs / 1000, until).then(() => {
          if (until.aborted) return;
          // A /run still running holds its worker, not storage (its timeout paused while our
          // checkpoint stays open, or armed just before the halt): waited for, as it ends on its own.
          if (this.runTimeouts.inFlight > 0) return bound();
          const wait_s = this.runTimeoutMs / 1000;
          this.workersLeftAtHalt = new CheckpointError(
            "storage_error",
            `${this.options.outPath}: a worker did not come back within --run-timeout-s (${wait_s} s) of the halt (its storage hangs?): the row it was finishing may not be in --out, and a line whose write has begun may still land (resultsWriteUnderWay, resultsWriteEnded)`,
          );
          reject(this.workersLeftAtHalt);
        });
      if (this.haltBegun.signal.aborted) return bound();
      this.haltBegun.signal.addEventListener("abort", bound, { once: true });
      until.addEventListener("abort", () => this.haltBegun.signal.removeEventListener("abort", bound), { once: true });
    });
  }

  /**
   * Waits, at most --run-timeout-s in all, for the workers to come back once stopSending() woke
   * them (their /runs are aborted, so only storage can hold one: a task line read, a
   * dispatched.jsonl append) and for the lock to drain: our checkpoint under way (given up once
   * `leaving` is aborted, then resumed), retires (flushRetires) and forgets (forgetSoon) still sent.
   * True when every worker came back (and the appends to --out they were making ended).
   */
  private async drained(workers: Promise<void>[]): Promise<boolean> {
    const bound = new AbortController();
    const timedOut = delay(this.runTimeoutMs / 1000, bound.signal).then(() => false);
    // A row's append to --out is its worker's (dispatch awaits it): under the same bound.
    const workersBack = Promise.allSettled(workers)
      .then(() => Promise.allSettled([...this.finishing]))
      .then(() => true);
    // Nothing queues behind this once stopped: no timer, no retry or background resend, and
    // forgetQueued sends nothing once stopping.
    const lockDrained = this.lock.run(() => undefined).then(() => true);
    const [back, done] = await Promise.all([Promise.race([workersBack, timedOut]), Promise.race([lockDrained, timedOut])]).finally(() => bound.abort());
    const wait_s = this.runTimeoutMs / 1000;
    if (!back) this.options.logger.warn({ wait_s }, "a worker did not come back within --run-timeout-s of the collection failing (its storage hangs?); failing without it");
    if (!done) this.options.logger.warn({ wait_s }, "our checkpoint, a retire or a forget under way did not end within --run-timeout-s of the collection failing (the controller does not answer?); failing without it");
    return back;
  }

  private async worker(): Promise<void> {
    for (;;) {
      if (this.stopping) return;
      await this.waitForGate();
      if (this.stopping) return;
      const next = this.queue.next();
      if (!next) {
        // Only an in-flight row can come back (a failed /run is retried), or one waiting for the
        // retire of its failed attempt (retireQueued wakes us). Other queued retires are not
        // waited for: close() drains them.
        if (this.queue.counts.inflight === 0 && this.queue.counts.pending === 0) return;
        // Rows may come back: wait for any change.
        await new Promise<void>((resolve) => this.dispatchWaiters.push(resolve));
        continue;
      }
      this.queue.set(next, "inflight");
      const reply = this.dispatch(next);
      next.reply = reply;
      try {
        await reply;
      } finally {
        this.admission.left(next); // a probe that is gone hands over to a row waiting for it
        this.unreachable.left(next);
      }
      this.wakeDispatchers();
      this.report(false);
    }
  }

  private async dispatch(state: RowState): Promise<void> {
    let episode = { rollout_id: state.row.rolloutId, attempt: state.attempt };
    // Read (from a regular tasks file, through its descriptor held since start-up) only while the
    // row is sent: held for every row, the tasks filled the heap. Before the attempt is logged: a
    // line changed since start-up sends nothing.
    const task = await loadTask(state.row);
    // Halted (or failed) while its line was read: nothing is logged any more.
    if (this.halted) return;
    // Once per attempt: an admission_closed retry sends the same attempt again. On disk before the
    // /run goes out: after a power loss the next start must find it, to retire it.
    await this.log.record(episode);
    for (;;) {
      if (this.halted) return;
      await this.storageHold(state);
      if (this.stopping) return;
      state.refused = false;
      let response: Response;
      const timeout = this.runTimeouts.start(this.runTimeoutMs);
      const ticket = this.admission.sending();
      const connectTicket = this.unreachable.sending();
      // While rows wait for the admission probe: a refusal comes at once, and an admitted /run
      // replies only when its rollout ends, so one unanswered for admittedAfterS was admitted.
      const admittedTimer = this.admission.probing ? setTimeout(() => this.admission.answered(ticket), this.pauses.admittedAfterS * 1000).unref() : undefined;
      let body: Record<string, unknown>;
      try {
        response = await fetch(this.options.runUrl, {
          method: "POST",
          headers: { "content-type": "application/json", ...(this.records && { [TRAJECTORY_HEADER]: "1" }) },
          body: JSON.stringify({ rollout_id: episode.rollout_id, attempt: episode.attempt, task }),
          signal: timeout.signal,
          // The run timeout stands still while a checkpoint parks the episode; fetch's own 300 s would not.
          dispatcher: UNTIMED_FETCH_DISPATCHER,
        });
        // Capped: past it, payload_too_large fails the attempt like a lost reply. A body cut off or
        // not JSON reads as {}: no refusal and no reward, so the attempt fails.
        const text = await readCappedText(response, this.options.maxRunReplyBytes ?? MAX_RUN_REPLY_BYTES, "/run reply").catch((error: unknown) => {
          if (error instanceof CheckpointError && error.code === "payload_too_large") throw error;
          return "";
        });
        try {
          body = JSON.parse(text) as Record<string, unknown>;
        } catch {
          body = {};
        }
      } catch (error) {
        if (this.stopping) return;
        const notSent = neverSentCode(error);
        if (notSent === undefined || this.unreachableTooLong(state)) return this.failed(state, error);
        // No connection was made: the attempt never started anywhere (the Gym is down or restarting).
        // It is sent again once --run-url accepts connections, as a refused admission is: counted
        // as a failed attempt, an outage would use up every row's attempts within a second.
        timeout.done();
        const sendAgain = await this.waitForRunUrl(state, notSent, connectTicket);
        if (this.stopping) return;
        if (!sendAgain) return this.failed(state, error);
        continue;
      } finally {
        timeout.done();
        clearTimeout(admittedTimer);
      }
      this.runUrlAnswers(state, connectTicket);
      // Halted meanwhile: the reply is dropped (the dispatch log has the attempt; the next start retires it).
      if (this.halted) return;
      const refusal = ErrorReplySchema.safeParse(body);
      // Any answer but admission_closed: admission is open, and the rows waiting for the probe go again.
      if (response.ok || !refusal.success || refusal.data.error.code !== "admission_closed") this.admission.answered(ticket);
      if (response.ok) {
        this.storageAnswers(state);
        this.admissionReopened();
        const reply = parseRunReply(body);
        return reply instanceof Error ? this.failed(state, reply) : this.finished(state, reply, task);
      }
      if (refusal.success && refusal.data.error.code === "storage_error") return this.storageRefused(state, refusal.data.error.detail);
      this.storageAnswers(state);
      if (refusal.success && refusal.data.error.code === "admission_closed") {
        // The attempt never started: wait for the checkpoint to end and send it again.
        this.runsNowhere(state);
        this.admissionClosedElsewhere();
        if (this.stopping) return;
        // Ours: every row goes again once it reopens. Another's (or a refusal that raced our
        // reopen): one row probes it, backing off, and the others wait for a row to be admitted.
        if (this.gateOpen) await this.admission.refused(state, ticket);
        await this.waitForGate(); // never re-sent while our checkpoint is open: it counts the row as not running
        if (this.stopping) return;
        continue;
      }
      if (refusal.success && refusal.data.error.code === "stale_attempt" && state.fencedSkips < MAX_FENCED_SKIPS) {
        // Fenced before it started (a restore's clean-up retired attempt+1 at the coordinator while
        // our predecessor never learnt it): not a failure of the row. The next attempt goes, logged
        // first like any other; bounded, since a server that fences every attempt would loop.
        state.fencedSkips++;
        this.goesOnFromInput(state);
        this.retired.add(state.row.rolloutId); // its fences are lifted (forget) once a later attempt replies
        this.options.logger.info({ rollout_id: episode.rollout_id, attempt: episode.attempt }, "/run refused the attempt as fenced; sending the next one");
        episode = { rollout_id: episode.rollout_id, attempt: episode.attempt + 1 };
        state.attempt = episode.attempt;
        await this.log.record(episode);
        if (this.stopping) return;
        continue;
      }
      if (refusal.success && refusal.data.error.code === "invalid_request" && !state.restored) {
        // The Gym refused the task itself (a malformed task, a replay seed it cannot run): every
        // attempt would be refused alike, so the row fails now instead of using up its attempts.
        // (A callee's refusal arrives as upstream_failed, a failed attempt: docs/gym.md.)
        // Not a restored continuation: refused for a task that differs from the checkpoint's (the
        // task file was edited), the next attempt starts from input and may well run.
        const { detail } = refusal.data.error;
        this.options.logger.warn({ rollout_id: episode.rollout_id, attempt: episode.attempt, code: "invalid_request", detail }, "/run refused the task; the row fails without another attempt");
        return this.failed(state, new Error(`/run refused the task: invalid_request: ${detail.slice(0, 200)}`), true);
      }
      return this.failed(state, new Error(`/run answered ${response.status}: ${JSON.stringify(body).slice(0, 200)}`));
    }
  }

  /** --run-timeout-s: one /run's bound, and how long a row waits for a retire or for --run-url to accept connections. */
  private get runTimeoutMs(): number {
    return (this.options.runTimeoutSeconds ?? 300) * 1000;
  }

  /** Its send was refused before it started (admission closed, no server): a checkpoint waiting for its reply stops waiting. */
  private runsNowhere(state: RowState): void {
    state.refused = true;
    for (const wake of state.refusalWaiters.splice(0)) wake();
  }

  /** The row has waited --run-timeout-s for --run-url to accept a connection: its attempt fails (counted) after all. */
  private unreachableTooLong(state: RowState): boolean {
    return state.unreachableSince !== undefined && performance.now() - state.unreachableSince >= this.runTimeoutMs;
  }

  /**
   * A send (`ticket`) found no server at --run-url: the row runs nowhere (a checkpoint does not wait
   * for its reply, as for a refused admission) until it is sent again, never while a checkpoint of
   * ours is open. One row probes, backing off; the others wait until a connection is made
   * (RefusalProbe). False: the row waited its --run-timeout-s and --run-url still accepts none (its
   * attempt fails, and it was not sent again: rows sent at their bound all at once would be the
   * burst of connects the probe avoids). The outage is logged once when it begins (again if this
   * collector then runs out of file descriptors) and once when it ends.
   */
  private async waitForRunUrl(state: RowState, code: string, ticket: number): Promise<boolean> {
    const since = (state.unreachableSince ??= performance.now());
    const fdShort = outOfDescriptors(code);
    if (this.runUrlDown === undefined || (fdShort && this.runUrlDown.noDescriptor === undefined)) {
      this.runUrlDown ??= { since: performance.now() };
      if (fdShort) this.runUrlDown.noDescriptor = code;
      this.options.logger.warn(
        { run_url: this.loggedRunUrl, code },
        fdShort
          ? "this collector has no file descriptor left to connect to --run-url with (raise ulimit -n, or lower --concurrency); rows are sent again once one is free, without counting failed attempts"
          : "--run-url accepts no connections (the Gym is down or restarting); rows are sent again once it does, without counting failed attempts",
      );
    }
    this.runsNowhere(state);
    const sendAgain = await this.unreachable.refused(state, ticket, (this.runTimeoutMs - (performance.now() - since)) / 1000);
    await this.waitForGate();
    // Still down once past our checkpoint: a connection made meanwhile ends the outage, and the row goes.
    return sendAgain || this.runUrlDown === undefined;
  }

  /**
   * /run answered `storage_error`: a Gym server's storage refused a write (the model proxy's capture
   * ledger on a full disk, say). The attempt may have run part way, so it is retired and the row
   * sent again as its next attempt, as after any failure, but the operator's disk is not the row's
   * fault: it spends none of --max-attempts, and the row is not sent again for `pauses.storageS` (it
   * would otherwise burn through attempts, each refused in milliseconds). A row
   * refused so for --run-timeout-s counts its attempts again, so an outage that does not end ends the
   * collection.
   */
  private storageRefused(state: RowState, detail: string): void {
    const now = performance.now();
    state.storageRefusedSince ??= now;
    const error = new CheckpointError("storage_error", `/run: ${detail.slice(0, 300)}`);
    // Counted, and so is every refusal after it while the spell lasts.
    if (now - state.storageRefusedSince >= this.runTimeoutMs) return this.failed(state, error);
    state.storageHeldUntil = now + this.pauses.storageS * 1000;
    this.storageRefusals.failed(error, "/run answered storage_error (a Gym server's storage refuses writes): the attempt is retired and the row sent again after a pause, without spending an attempt", {
      rollout_id: state.row.rolloutId,
      attempt: state.attempt,
      pause_s: this.pauses.storageS,
    });
    this.failed(state, error, false, false);
  }

  /**
   * A /run reply other than `storage_error`: the row's storage spell is over, and so is the
   * collection's when this row was in it (another row's success says nothing of a refusal that may
   * be one row's own: logged so, the spell would end and begin again with every pause).
   */
  private storageAnswers(state: RowState): void {
    if (state.storageRefusedSince === undefined) return;
    delete state.storageRefusedSince;
    this.storageRefusals.succeeded();
  }

  /**
   * After `storage_error`, the row's next send waits for its pause to pass (the row runs nowhere
   * meanwhile: a checkpoint does not wait for its reply), and never goes while our checkpoint is open.
   * Other rows go on: a refusal that is the row's own (a task naming a file the environment lacks,
   * ENOENT) must not hold the collection back.
   */
  private async storageHold(state: RowState): Promise<void> {
    const until = state.storageHeldUntil;
    if (until === undefined) return;
    delete state.storageHeldUntil;
    if (until <= performance.now()) return;
    this.runsNowhere(state);
    for (let left = until - performance.now(); left > 0 && !this.stopping; left = until - performance.now()) {
      await delay(Math.min(left, 250) / 1000); // in slices: a stop does not wait out the pause
    }
    await this.waitForGate();
  }

  /**
   * /run answered admission_closed. While our own gate is open that is a checkpoint this collector
   * did not start (another controller's, or one left open): rows wait for it without a word, so one
   * still closing admission after admissionClosedWarnS is logged once, with what to do.
   */
  private admissionClosedElsewhere(): void {
    if (!this.gateOpen) return;
    this.admissionClosedSince ??= performance.now();
    if (this.admissionClosedWarned || performance.now() - this.admissionClosedSince < this.pauses.admissionClosedWarnS * 1000) return;
    this.admissionClosedWarned = true;
    this.options.logger.warn(
      { run_url: this.loggedRunUrl, closed_s: Math.round((performance.now() - this.admissionClosedSince) / 1000) },
      "/run keeps answering admission_closed while this collector has no checkpoint open: another controller's checkpoint is open (gym-ckpt status names it); rows are sent again once it is resumed, or once the participants' lease expires",
    );
  }

  /** A /run was admitted: a refusal spell, if logged, is over. */
  private admissionReopened(): void {
    if (this.admissionClosedWarned) this.options.logger.info({ run_url: this.loggedRunUrl, closed_s: Math.round((performance.now() - this.admissionClosedSince!) / 1000) }, "/run admits rows again");
    this.admissionClosedSince = undefined;
    this.admissionClosedWarned = false;
  }

  /** A send (`ticket`) reached --run-url and was answered. */
  private runUrlAnswers(state: RowState, ticket: number): void {
    delete state.unreachableSince;
    for (const [code, spell] of this.runFailureSpells) spell.succeeded({ code });
    this.runFailureSpells.clear();
    this.runUrlBack(ticket);
  }

  /**
   * A send (`ticket`) reached --run-url (a connection made to it is taken for one sent then): the
   * outage, if there was one, is over when it was sent after the last send that found no server (one
   * sent before says nothing of now), and the rows waiting for it go again. Told by the connection,
   * not only the reply: a /run replies when its rollout ends, minutes on, and the rows waiting would
   * sit out the probe's rollout (or fail at their --run-timeout-s).
   */
  private runUrlBack(ticket: number): void {
    const down = this.runUrlDown;
    // Short of descriptors, a connection made frees none: waking every waiting row would have most
    // fail EMFILE again at once. A few go per connection made; the spell ends once none waits.
    const wakeAtMost = down?.noDescriptor === undefined ? Infinity : WOKEN_PER_CONNECTION_SHORT_OF_DESCRIPTORS;
    if (!this.unreachable.answered(ticket, wakeAtMost) || down === undefined) return;
    const fields = { run_url: this.loggedRunUrl, down_s: (performance.now() - down.since) / 1000 };
    if (down.noDescriptor === undefined) this.options.logger.info(fields, "--run-url accepts connections again");
    else this.options.logger.info({ ...fields, code: down.noDescriptor }, "--run-url accepts connections again: this collector has a file descriptor to connect with again (it had none left: not the Gym's outage)");
    this.runUrlDown = undefined;
  }

  private finished(state: RowState, reply: RunReply, task: Record<string, unknown>): Promise<void> {
    const done = this.appendFinished(state, reply, task);
    this.finishing.add(done);
    const forget = () => void this.finishing.delete(done);
    done.then(forget, forget);
    return done;
  }

  private async appendFinished(state: RowState, reply: RunReply, task: Record<string, unknown>): Promise<void> {
    // The trajectory goes to the rollout records, not into results.jsonl.
    const { trajectory, ...body } = reply;
    let line: string;
    try {
      line = resultLineText(
        { rollout_id: state.row.rolloutId, attempt: state.attempt, reward: body.reward, continued: state.continued, finished_at: Date.now() / 1000, response: body },
        this.options.maxResultLineBytes,
      );
    } catch (error) {
      // A line no start could read back would refuse every later start: the attempt fails instead,
      // as a reply past the body cap does.
      if (error instanceof CheckpointError && error.code === "payload_too_large") return this.failed(state, error);
      throw error;
    }
    this.queue.set(state, "done");
    this.queue.setRestored(state, false);
    if (this.records) this.unsynced.add(state.row.rolloutId);
    await appendResultText(this.options.outPath, line, this.appendsGivenUp.signal);
    if (this.records) this.recordRollout(state, trajectory, task);
    const usage = body.usage;
    if (usage) {
      this.usage.modelCallsKept += usage.model_calls_kept ?? 0;
      this.usage.tokensKept += usage.tokens_kept ?? 0;
      this.usage.modelCallsRegenerated += usage.model_calls_regenerated ?? 0;
      this.usage.tokensRegenerated += usage.tokens_regenerated ?? 0;
    }
    if (this.retired.has(state.row.rolloutId) || state.continued) {
      // A later attempt replied: nothing of the retired ones, nor of the source attempts a restore
      // continued (which participants fence until forget), can still run, so lift the fences.
      this.toForget.add(state.row.rolloutId);
      this.forgetSoon();
    }
  }

  /** Buffers the finished row's rollout record; a reply without a valid trajectory is counted, not fatal. */
  private recordRollout(state: RowState, raw: unknown, task: Record<string, unknown>): void {
    const parsed = RunTrajectorySchema.safeParse(raw);
    if (!parsed.success) {
      this.records!.skip();
      if (this.records!.stats.skipped === 1) this.options.logger.warn({ rollout_id: state.row.rolloutId }, "/run replied without a trajectory; no rollout record for it");
      return;
    }
    const key = captureKey({ rollout_id: state.row.rolloutId, attempt: state.attempt });
    try {
      this.records!.add(
        traceRecordFromTrajectory({
          id: sha256Hex(`${this.runId}/${key}`).slice(0, 32),
          taskIdx: this.rowIndex.get(state.row.rolloutId) ?? -1,
          task,
          trajectory: parsed.data,
          info: { rollout_id: state.row.rolloutId, attempt: state.attempt, continued: state.continued, run_id: this.runId },
        }),
      );
    } catch (error) {
      this.records!.skip();
      this.options.logger.warn({ err: error, rollout_id: state.row.rolloutId }, "trajectory is not a valid rollout record");
    }
  }

  /**
   * Stops the collection where it is, for an exit without a checkpoint (SIGINT, SIGHUP) or after the
   * stop checkpoint: no further /run is sent, no checkpoint runs, no failed retire is tried again
   * (flushRetires), and a reply arriving from now on is
   * dropped, not appended to --out (the dispatch log names its attempt, so the next start retires
   * it and sends the row again). Resolves once the rows already being appended are in --out and
   * their records buffered, so the flush that follows writes every row --out has. `resumeCheckpoint`
   * (an exit without a checkpoint): a timer or SIGUSR1 checkpoint under way is given up and resumed
   * before this resolves, and none starts after it; so is the start's restore (resumed once it answers).
   * The appends and the tasks file's close are storage, which on a mount that hangs never answers:
   * waited for at most --run-timeout-s in all (as a failed run() waits for its workers), then a
   * warning says which was not, and the exit goes on without it. run() resolves with the summary
   * (stopped) once its workers are back, or rejects storage_error if one is not back --run-timeout-s
   * after this (workersHeldPastHalt).
   */
  async halt({ resumeCheckpoint = false }: { resumeCheckpoint?: boolean } = {}): Promise<void> {
    this.halted = true;
    this.stopping = true;
    clearInterval(this.timer);
    clearTimeout(this.retireRetry);
    this.ownOps.clearRetryTimer();
    this.wakeDispatchers();
    // Workers parked while our checkpoint is open come back now (nothing is sent any more), not when it ends.
    for (const wake of this.gateWaiters.splice(0)) wake();
    this.admission.wakeAll();
    this.unreachable.wakeAll();
    if (resumeCheckpoint) {
      // A checkpoint (timer, SIGUSR1) under way is given up and resumed first: left prepared, it
      // would keep the Gym parked until the participants' lease expires once the exit closes NATS.
      // An op already sent is not cut short. A stop checkpoint is not waited for (a SIGINT cuts it short).
      this.leaving.abort();
      await this.resumableCheckpoint;
    }
    this.haltBegun.abort();
    let appended = false;
    const appends = Promise.allSettled([...this.finishing]).then(() => void (appended = true));
    // Closing the tasks file waits for the reads under way (FileHandle.close): a worker held by its
    // task line read holds it. Not waited for, it closes once that read ends (a worker then sends nothing).
    const closed = await finishedWithin(appends.then(() => this.closeTasks()), this.runTimeoutMs);
    // Stopped: an append still queued (behind one its storage holds) never lands after the exit's outcome.
    this.giveUpAppends("the collector stopped before this line's turn");
    if (closed) return; // no row is sent from here on
    void this.closeTasks();
    const wait_s = this.runTimeoutMs / 1000;
    if (!appended) this.options.logger.warn({ wait_s, appending: this.finishing.size }, "rows being appended to results.jsonl did not end within --run-timeout-s of the halt (its storage hangs?); exiting without waiting for them or for the tasks file's close: the next start runs those rows again if their lines are not there");
    else this.options.logger.warn({ wait_s }, "the tasks file's close did not end within --run-timeout-s of the halt (a task line read under way hangs?); exiting without it");
  }

  /**
   * The exit goes on without the appends to --out still under way: those not begun never begin (a
   * line landing after the collection's outcome, the lock let go, could land after the next start
   * read --out, and its row would be in it twice); one whose write has begun cannot be called back,
   * which resultsWriteUnderWay says (the lock is kept while it is).
   */
  private giveUpAppends(why: string): void {
    // Once: a halt after a failed run() (or after the last sync was given up) decides nothing new.
    if (this.appendsGivenUp.signal.aborted) return;
    this.appendsGivenUp.abort(new CheckpointError("storage_error", `${this.options.outPath}: not appended: ${why}`));
    if (resultWriteUnderWay(this.options.outPath)) {
      this.options.logger.warn({ out: this.options.outPath }, "a results.jsonl line's write is under way on storage that hangs and cannot be called back; no later line follows it");
    }
  }

  /**
   * A line's write to --out has begun and not returned (its storage hangs): it may still land, whole
   * or as a torn last line. The lock stays held (collector.pid naming this process) while it is, so
   * no start reads --out before that write has ended, one way or the other.
   */
  get resultsWriteUnderWay(): boolean {
    return resultWriteUnderWay(this.options.outPath);
  }

  /** Settles once no line's write to --out is under way: the lock resultsWriteUnderWay kept can go then. */
  resultsWriteEnded(): Promise<void> {
    return resultWritesEnded(this.options.outPath);
  }

  /**
   * Lets go of the tasks file the rows' lines are read from, held open since start-up: once no row
   * can be sent any more (run() ended, halt(), a failed start). A load under way ends first.
   */
  private closeTasks(): Promise<void> {
    this.tasksClosed ??= closeTaskRows(this.options.rows);
    return this.tasksClosed;
  }

  /**
   * The workers are done (the collection closes, summarises, or failed), or about to be: every row
   * is done or failed for good, none left to send or running (the last one's line may still be on
   * its way to --out). A checkpoint asked for now is skipped, and a SIGTERM exits with the
   * collection's own code: there is nothing to continue, and a stop checkpoint would only park the
   * Gym and have the job requeued (75) to close it again.
   */
  get hasEnded(): boolean {
    return this.ended || this.nothingLeft();
  }

  /** Every row is done or failed for good (after start-up): no worker sends anything any more. */
  private nothingLeft(): boolean {
    const { counts } = this.queue;
    return this.states.size > 0 && counts.pending === 0 && counts.inflight === 0;
  }

  /** Publishes buffered rollout records now (before exiting), waiting at most --run-timeout-s (closeRecordsWithin). */
  async flushRecords(): Promise<void> {
    await this.closeRecordsWithin();
  }

  /**
   * The final records flush of an exit that stops the collection where it is (halt, a failed run).
   * It syncs --out first (and writes the records' files), which on a mount that hangs never ends:
   * waited for at most --run-timeout-s, then the records it had not written are counted unwritten
   * and a warning says so. A rejection of the flush rejects.
   */
  private async closeRecordsWithin(): Promise<void> {
    const records = this.records;
    if (!records || (await finishedWithin(records.close(), this.runTimeoutMs))) return;
    records.abandon();
    this.options.logger.warn(
      { wait_s: this.runTimeoutMs / 1000, unwritten: records.stats.unwritten },
      "the final flush of the rollout records did not end within --run-timeout-s (results.jsonl's sync or the records directory hangs?); exiting without it: those rows are in --out only",
    );
  }

  /**
   * The row's next attempt runs from input: when the one that ends was the restored continuation
   * (fenced before it started, or failed), the row is restarted after all, not continued, and
   * results.jsonl, its record and the summary say so.
   */
  private goesOnFromInput(state: RowState): void {
    if (state.restored) {
      state.continued = false;
      this.restartedCount++;
    }
    this.queue.setRestored(state, false);
  }

  /**
   * A /run without a reply: its attempt is queued for retirement (batched, never inside a
   * checkpoint) and the row is sent again as the next attempt, which the retire does not fence —
   * but only once that retire has finished: the server may still run the failed attempt (a
   * timeout here is not one there) and refuses any other attempt of the rollout meanwhile.
   * `final` fails the row for good now; `counted` false spends none of --max-attempts (the caller logs it).
   */
  private failed(state: RowState, error: unknown, final = false, counted = true): void {
    const maxAttempts = this.options.maxAttempts ?? 3;
    const forGood = final || (counted && state.failures + 1 >= maxAttempts);
    if (!final && counted) this.logRunFailure(state, error, forGood, maxAttempts);
    state.lastFailure = error instanceof Error ? error.message : String(error);
    this.toRetire.push({ rollout_id: state.row.rolloutId, attempt: state.attempt });
    if (counted) {
      state.failures++;
      // Failed otherwise (no reply): a refusal after this one starts a spell of its own.
      if (!(error instanceof CheckpointError && error.code === "storage_error")) delete state.storageRefusedSince;
    }
    this.goesOnFromInput(state);
    if (forGood) {
      this.queue.set(state, "failed");
    } else {
      state.retiring = state.attempt;
      state.attempt++;
      this.queue.set(state, "pending");
    }
    this.flushRetires();
  }

  /**
   * One `/run failed` line: whether the row is sent again (`retried`, `tries` of `max_attempts`) or
   * failed for good. An expected network failure (reset, dropped, timed out) goes without the HTTP
   * client's stack, and its spell (every row in flight failing alike as a Gym server crashes at
   * --concurrency N) warns once per code and logs the rows sent again after it at debug, until a
   * /run gets a reply. A row failed for good always warns; an unexpected error keeps its stack.
   */
  private logRunFailure(state: RowState, error: unknown, forGood: boolean, maxAttempts: number): void {
    const fields = { rollout_id: state.row.rolloutId, attempt: state.attempt, tries: state.failures + 1, max_attempts: maxAttempts, retried: !forGood };
    const message = forGood ? "/run failed; the row failed for good" : "/run failed; the row is sent again";
    const code = networkFailureCode(error);
    if (code === undefined) return void this.options.logger.warn({ ...fields, err: error }, message);
    const err = new NetworkFailure(error, code);
    if (forGood) return void this.options.logger.warn({ ...fields, err }, message);
    let spell = this.runFailureSpells.get(code);
    if (!spell) this.runFailureSpells.set(code, (spell = new FailureSpellLog(this.options.logger, "/run replies again")));
    spell.failed(err, message, fields);
  }

  /**
   * Retires the queue now; while a row waits for its retire, a failed one is tried again. A row
   * whose retire has kept failing for --run-timeout-s (Gym servers down) fails for good: its
   * attempt leaves the queue, and the dispatch log still names it for the next start to retire.
   */
  private flushRetires(): void {
    void this.lock.run(() => this.retireQueued()).catch((err: unknown) => {
      // The attempt a row waits for is still in toRetire: a batch leaves it only once retired.
      const now = performance.now();
      let waiting = 0;
      for (let i = this.toRetire.length - 1; i >= 0; i--) {
        const e = this.toRetire[i]!;
        const state = this.states.get(e.rollout_id);
        if (state?.retiring !== e.attempt) continue;
        state.retireFailingSince ??= now;
        if (now - state.retireFailingSince < this.runTimeoutMs) {
          waiting++;
          continue;
        }
        this.options.logger.warn({ rollout_id: e.rollout_id, attempt: e.attempt }, "the retire this row waits for kept failing; the row fails");
        state.lastFailure = `the retire of its failed attempt ${e.attempt} kept failing for --run-timeout-s (after: ${state.lastFailure ?? "?"})`;
        this.toRetire.splice(i, 1);
        delete state.retiring;
        delete state.retireFailingSince;
        this.queue.set(state, "failed");
      }
      this.retiresFailing = waiting;
      this.wakeDispatchers();
      this.report(false);
      this.retireFailures.failed(err, this.halted ? "retire failed; the next start retires its attempts" : waiting ? "retire failed; retrying" : "retire failed; retried before the next checkpoint");
      // Not once halted (a signal, or the collection failed): halt() and run() cleared the timer,
      // and a retire sent after them goes out as the lock is released and NATS closed.
      if (waiting && !this.retireRetry && !this.halted) {
        this.retireRetry = setTimeout(() => {
          this.retireRetry = undefined;
          this.flushRetires();
        }, this.pauses.retireS * 1000);
      }
    });
  }

  /** `send` wraps each batch's request (see retireAtStart). */
  private async retireNow(episodes: EpisodeId[], send: (retire: () => Promise<unknown>) => Promise<unknown> = (retire) => retire()): Promise<void> {
    for (let i = 0; i < episodes.length; i += RETIRE_BATCH) {
      const batch = episodes.slice(i, i + RETIRE_BATCH);
      await send(() => this.options.controller.retire({ episode_ids: batch, deadline_ts: this.deadline() }));
      this.retireFailures.succeeded();
    }
    for (const e of episodes) this.retired.add(e.rollout_id);
  }

  /**
   * A start's retire, sent again while its outcome is unknown (a leader failover mid-op), as the
   * start's other controller ops are: taken for a failure, it would fail the start (the job) for
   * a failover the next op rides out. A retire is idempotent (it fences up to the attempt named).
   * So is one a participant is `unreachable` for (a Gym process restarting as a supervisor starts
   * the collector again), every `pauses.retireS` for at most --run-timeout-s, as the run's own
   * retires are (flushRetires): a participant gone for good leaves the membership view within
   * its heartbeat TTL, and the retire then goes without it.
   * One a participant refuses because it is still parked in a checkpoint the coordinator no longer
   * has open (an earlier run's restore or checkpoint whose resume never reached it:
   * `checkpoint_conflict` in a restore, `invalid_phase` in a checkpoint) is sent again once that
   * checkpoint is resumed (see resumeParkedElsewhere), within the same --run-timeout-s.
   */
  private retireAtStart(episodes: EpisodeId[]): Promise<void> {
    return this.retireNow(episodes, async (retire) => {
      const since = performance.now();
      let resumedParked = false;
      for (;;) {
        try {
          return await this.ownOps.resent("retire", undefined, retire);
        } catch (error) {
          const code = error instanceof CheckpointError ? error.code : undefined;
          if (performance.now() - since >= this.runTimeoutMs) throw error;
          if (code === "checkpoint_conflict" || code === "invalid_phase") {
            // Sent again at once after the first resume; paced after later ones (a participant whose resume keeps failing).
            if (resumedParked) await delay(this.pauses.retireS);
            if (!(await this.resumeParkedElsewhere(error))) throw error;
            resumedParked = true;
            continue;
          }
          if (code !== "unreachable") throw error;
          this.retireFailures.failed(error, "the start's retire found a participant unreachable; sending it again");
          await delay(this.pauses.retireS);
        }
      }
    });
  }

  /**
   * Resumes the checkpoints participants' status shows them still parked in while the coordinator
   * has none open: nobody else will (their controller is gone, its resume lost), and they refuse
   * every retire until their lease expires. The refusal names the checkpoint only in its text, the
   * status names it as data. With a checkpoint open at the coordinator nothing is resumed (another
   * controller's op may be under way, and the coordinator itself refused), nor with a status that
   * is not the ready (recovered) leader's: false, as when no participant holds one. Nor is another
   * controller's published stop checkpoint (see parkedForAnotherControllersStop).
   */
  private async resumeParkedElsewhere(refusal: unknown): Promise<boolean> {
    const status = await this.ownOps.resent("start-up status", undefined, () => this.options.controller.status());
    // Only the ready leader's "nothing open" counts: a follower (over HTTP) or a leader still
    // recovering answers null while the leader has (or recovery reopens) another controller's
    // checkpoint, prepared or restored between its steps, which the resume would abort or end.
    const { leader, ready } = status.coordinator;
    if (status.checkpoint || !leader || !ready) return false;
    const parked = [...new Set(status.participants.filter((p) => p.checkpoint_id && p.phase !== null && p.phase !== "idle").map((p) => p.checkpoint_id!))];
    // Every id looked up before anything is resumed: a lookup that fails fails the start unresumed.
    const held: string[] = [];
    for (const id of parked) {
      if (await this.parkedForAnotherControllersStop(id)) {
        this.options.logger.warn({ checkpoint_id: id, err: refusal }, "the start's retire was refused by participants parked in another controller's stop checkpoint; left for that controller to stop");
      } else {
        held.push(id);
      }
    }
    for (const id of held) {
      this.options.logger.warn({ checkpoint_id: id, err: refusal }, "the start's retire was refused by participants still parked in a checkpoint nobody resumed; resuming it");
      await this.ownOps.resumeSent("resume of a checkpoint participants were left parked in", id).catch((error: unknown) => {
        // A restore cleaned up after restore_failed: the coordinator sent its clean-up's resume again there (see resumeCleanedUp).
        if (!(error instanceof CheckpointError && error.code === "restore_failed")) throw error;
      });
    }
    return held.length > 0;
  }

  /**
   * Whether `id` is a published stop checkpoint this collection's log does not name. A stop
   * checkpoint is closed by its publish while its Gym stays parked, by design, for its controller
   * to stop (a scheduler's grace period): resumed, its rollouts would run on. One the log names
   * (this collection's earlier run, or the collection --new-collection abandons) is ours to let go:
   * nobody else will. Any other published checkpoint's participants are parked only because its
   * resume never reached them; an id not published (`not_found`) is a restore or an aborted checkpoint.
   */
  private async parkedForAnotherControllersStop(id: string): Promise<boolean> {
    if (this.loggedCheckpoints.has(id)) return false;
    return this.ownOps.resent("start-up get", id, () => this.options.controller.get(id)).then(
      ({ manifest }) => manifest.stop,
      (error: unknown) => {
        if (error instanceof CheckpointError && error.code === "not_found") return false;
        throw error;
      },
    );
  }

  // ---- checkpoints -----------------------------------------------------------------------

  /** prepare → commit(scope) → collection.json → publish → resume (or stop). */
  async checkpoint({ stop }: { stop: boolean }): Promise<{ published: boolean; checkpointId: string }> {
    this.checkpointsPending++;
    if (stop) this.stopsPending++;
    return tracer().startActiveSpan("checkpoint.collection.checkpoint", { attributes: { "gym_ckpt.stop": stop } }, async (span) => {
      try {
        const result = await this.checkpointInSpan(stop, span);
        if (!result) {
          span.setAttribute("gym_ckpt.skipped", true);
          return { published: false, checkpointId: "" };
        }
        span.setAttributes({ "gym_ckpt.published": result.published, "gym_ckpt.in_flight": this.inFlight() });
        this.instruments.checkpoints.add(1, { outcome: result.published ? "published" : "not_prepared" });
        return result;
      } catch (error) {
        markSpanFailed(span, error);
        this.instruments.checkpoints.add(1, { outcome: "failed" });
        throw error;
      } finally {
        span.end();
      }
    }).finally(() => {
      this.checkpointsPending--;
      if (stop) this.stopsPending--;
    });
  }

  /** Undefined: skipped (a checkpoint that waited while a stop was asked for, anything after a stop, or once no row is left to run: hasEnded). */
  private async checkpointInSpan(stop: boolean, span: Span): Promise<{ published: boolean; checkpointId: string } | undefined> {
    return this.lock.run(async () => {
      // The stop goes first, ahead of a timer or SIGUSR1 checkpoint queued before it: a scheduler's
      // grace period is short, and after it nothing may resume.
      // Nor once leaving (a SIGINT): the process is on its way out, and nothing would resume it.
      if ((!stop && this.stopsPending > 0) || (!stop && this.stopping) || this.leaving.signal.aborted || this.hasEnded) return undefined;
      this.closeGate();
      await this.ownOps.resumeUnresumed();
      const checkpointId = newCheckpointId(Date.now());
      // Set now, so a checkpoint that fails still names its id.
      span.setAttribute("gym_ckpt.checkpoint.id", checkpointId);
      const log = this.options.logger.child({ checkpoint_id: checkpointId, stop });
      let published = false;
      const resumed = stop ? undefined : this.resumable();
      try {
        await this.retireQueued();
        // Halted (the collection failed) with retires still queued, which retireQueued no longer
        // sends: `leaving` is aborted only once the failure has reached run()'s catch, and a prepare
        // now would park and capture those failed attempts' episodes, unretired, for a checkpoint given up next.
        if (this.halted && this.toRetire.length) return this.givenUp(log, checkpointId);
        // Logged first: a start after a crash mid-checkpoint closes it as ours, and no other open one.
        await this.log.recordCheckpoint(checkpointId);
        if (this.leaving.signal.aborted) return this.givenUp(log, checkpointId);
        const prepared = await this.options.controller.prepare({ checkpoint_id: checkpointId, deadline_ts: this.deadline() });
        if (!prepared.prepared) {
          log.warn({ blockers: prepared.blockers, stopped_at: prepared.stopped_at }, "prepare did not finish; checkpoint not published");
          return { published, checkpointId };
        }
        if (this.leaving.signal.aborted) return this.givenUp(log, checkpointId);
        const restarts = new Set(prepared.restarts);
        // In input order, as a walk of every row gave them; only the open rows are looked at.
        const open = this.queue.open().sort((a, b) => this.rowIndex.get(a.row.rolloutId)! - this.rowIndex.get(b.row.rolloutId)!);
        const scope = open.map((s) => ({ rollout_id: s.row.rolloutId, attempt: s.attempt })).filter((e) => !restarts.has(captureKey(e)));
        const restarted = open.map((s) => ({ rollout_id: s.row.rolloutId, attempt: s.attempt })).filter((e) => restarts.has(captureKey(e)));
        const committed = await this.ownOps.commitOwn(checkpointId, scope, stop);
        if (this.leaving.signal.aborted) return this.givenUp(log, checkpointId);
        // Its files are read and written below through our root: refused (and resumed) unless they are there.
        await assertCheckpointVisible(this.options.checkpointDir, checkpointId, committed.checkpoint_dir);

        // A /run reply already on the wire belongs to an episode no episode owner exported: wait for it.
        // Not for a restarted row (it parks at its next boundary until the resume) nor one refused
        // admission (it waits for this checkpoint to end): neither can reply before the resume.
        const exported = await this.exportedByOwners(committed);
        const onTheWire = open.filter((s) => {
          const key = captureKey({ rollout_id: s.row.rolloutId, attempt: s.attempt });
          return s.status === "inflight" && !s.refused && !restarts.has(key) && !exported.has(key);
        });
        const answered = (s: RowState) => Promise.race([s.reply, new Promise<void>((resolve) => s.refusalWaiters.push(resolve))]);
        // The bound's timer is cleared once they are in: it would keep the process up to a minute after the collection.
        const waited = new AbortController();
        await Promise.race([Promise.all(onTheWire.map(answered)), delay(this.options.checkpointTimeoutSeconds ?? 60, AbortSignal.any([waited.signal, this.leaving.signal]))]).finally(() => waited.abort());
        for (const s of onTheWire) s.refusalWaiters.length = 0;
        // The replies are dropped once leaving: the rows they would leave out of `continued` are not known.
        if (this.leaving.signal.aborted) return this.givenUp(log, checkpointId);
        // A reply still missing belongs to an episode nobody holds: a restore would install its next
        // attempt beside an environment that starts it from input. It restarts from input instead.
        // Likewise a row whose /run failed since the scope was taken (its attempt moved on, or it failed
        // for good), unless an owner exported that attempt: its episode ended where nobody holds it.
        const failedUnheld = (e: EpisodeId) => {
          const s = this.states.get(e.rollout_id)!;
          return s.status !== "done" && (s.status === "failed" || s.attempt !== e.attempt) && !exported.has(captureKey(e));
        };
        const unanswered = new Set(onTheWire.filter((s) => s.status === "inflight" && !s.refused).map((s) => s.row.rolloutId));
        const continued = scope.filter((e) => {
          const s = this.states.get(e.rollout_id)!;
          return s.status !== "done" && !s.refused && !unanswered.has(e.rollout_id) && !failedUnheld(e);
        });
        restarted.push(...scope.filter((e) => unanswered.has(e.rollout_id) || failedUnheld(e)));
        if (unanswered.size) log.warn({ rows: unanswered.size }, "a /run reply on the wire did not arrive within the checkpoint timeout; its row restarts from input after a restore");

        const state: CollectionState = { checkpoint_id: checkpointId, run_id: this.runId, created_at: Date.now() / 1000, continued, restarted, collection: collectionFields(this.identity) };
        const text = `${JSON.stringify(state, null, 2)}\n`;
        await replaceFileDurably(join(this.options.checkpointDir, checkpointId, COLLECTION_STATE_FILE), text);
        await this.ownOps.publishOwn(checkpointId, sha256Hex(text));
        published = true;
        this.checkpoints++;
        // On the reporter's clock, which its line measures the age on (a caller may give it another).
        this.lastCheckpointAt = this.options.progress ? this.options.progress.now() : progressClock();
        log.info({ continued: continued.length, restarted: restarted.length }, "checkpoint published");
        return { published, checkpointId };
      } catch (error) {
        // The one line naming the checkpoint that failed (its id is what the coordinator logged);
        // the callers (timer, SIGUSR1) log it again at debug only.
        log.warn({ err: error }, "checkpoint failed");
        throw error;
      } finally {
        if (stop && published) {
          this.stopping = true;
          this.admission.wakeAll(); // rows waiting for another controller's checkpoint end: nothing more is sent
          this.unreachable.wakeAll(); // and so do those waiting for --run-url to accept connections
        } else {
          await this.ownOps.resumeOwn(checkpointId, log, undefined, published);
        }
        this.openGate();
        this.report(true);
        resumed?.();
      }
    });
  }

  /**
   * A checkpoint or restore of ours is about to open: halt({ resumeCheckpoint }) waits until the
   * function returned is called, once it is resumed (or nothing more can be done for it).
   */
  private resumable(): () => void {
    let settle!: () => void;
    const open = new Promise<void>((resolve) => (settle = resolve));
    this.resumableCheckpoint = open;
    return () => {
      if (this.resumableCheckpoint === open) this.resumableCheckpoint = undefined;
      settle();
    };
  }

  /** A checkpoint (not a stop) that halt({ resumeCheckpoint }) came during: not published, and resumed (its finally) before the exit. */
  private givenUp(log: Logger, checkpointId: string): { published: boolean; checkpointId: string } {
    log.warn("the collector is stopping (no checkpoint): this checkpoint is resumed, not published");
    return { published: false, checkpointId };
  }

  /**
   * Capture keys the episode owners (environments, agents) exported. A commit reply over NATS
   * leaves long lists out (null, with count and digest): those are read back from the owner's
   * committed records in the checkpoint directory this collector shares (through its own root),
   * and checked against both.
   */
  private async exportedByOwners(committed: CtlReplyOf<"commit">): Promise<Set<string>> {
    const exported = new Set<string>();
    for (const p of committed.participants) {
      if (p.kind !== "environment" && p.kind !== "agent") continue;
      const ids = p.episode_ids ?? (await committedEpisodeIds(join(this.options.checkpointDir, committed.checkpoint_id), committed.checkpoint_id, p));
      for (const key of ids) exported.add(key);
    }
    return exported;
  }

  /**
   * Retires queued by failed /runs; called under the lock, before prepare. Not once halted: the
   * exit after halt() closes NATS and lets go of the lock, so a batch after it would race them; the
   * batch already sent ends, and the dispatch log names the rest for the next start to retire.
   */
  private async retireQueued(): Promise<void> {
    while (this.toRetire.length && !this.halted) {
      const batch = this.toRetire.slice(0, RETIRE_BATCH);
      await this.retireNow(batch);
      this.toRetire.splice(0, batch.length);
      for (const e of batch) {
        const state = this.states.get(e.rollout_id);
        if (state?.retiring === e.attempt) {
          delete state.retiring;
          delete state.retireFailingSince;
          this.queue.retireDone(state);
        }
      }
      this.retiresFailing = 0;
      this.wakeDispatchers();
    }
  }

  /**
   * Forgets rollouts whose later attempt replied; called under the lock, so never inside one of
   * our checkpoints, and not after a stop checkpoint, which stays open (forget would be refused).
   */
  private async forgetQueued(): Promise<void> {
    if (this.stopping) return;
    const rollouts = [...this.toForget];
    for (let i = 0; i < rollouts.length; i += RETIRE_BATCH) {
      const batch = rollouts.slice(i, i + RETIRE_BATCH);
      await this.options.controller.forget({ rollout_ids: batch, deadline_ts: this.deadline() });
      for (const id of batch) {
        this.toForget.delete(id);
        this.retired.delete(id);
      }
    }
  }

  /** Sends the queued forgets between checkpoints; one that fails is tried again at close. */
  private forgetSoon(): void {
    void this.lock.run(() => this.forgetQueued()).catch((err: unknown) => this.options.logger.warn({ err }, "forget failed; retried at close"));
  }

  /** Forgets every retired rollout; called once all rows are done. */
  private async close(): Promise<void> {
    await this.lock.run(async () => {
      // A checkpoint still unresumed keeps the Gym's admission closed for everyone until its lease.
      await this.ownOps.resumeUnresumed();
      // Only attempts of rows that failed for good are left to retire here. One that cannot be
      // retired now (Gym servers down) stays in dispatched.jsonl: the next start retires it and
      // sends its row again, so the collection still ends with its summary.
      await this.retireQueued().catch((err: unknown) => {
        this.options.logger.warn({ err, attempts: this.toRetire.length }, "could not retire the attempts of failed rows; the next start retires them");
        this.toRetire.length = 0;
      });
      for (const id of this.retired) this.toForget.add(id);
      // Likewise a forget: the fences it would lift only refuse attempts no later start sends (it
      // sends attempt + 1), so the collection still ends with its summary.
      await this.forgetQueued().catch((err: unknown) => {
        this.options.logger.warn({ err, rollouts: this.toForget.size }, "could not forget finished rollouts; their fences stay at the Gym servers until they restart");
      });
    });
  }

  // ---- helpers ---------------------------------------------------------------------------

  private wakeDispatchers(): void {
    for (const wake of this.dispatchWaiters.splice(0)) wake();
  }

  private closeGate(): void {
    this.gateOpen = false;
    this.runTimeouts.pause();
  }

  private openGate(): void {
    this.gateOpen = true;
    this.runTimeouts.resume();
    for (const wake of this.gateWaiters.splice(0)) wake();
  }

  /** Waits while a checkpoint of ours is open; not once stopping (nothing is sent then: a worker comes back at once). */
  private async waitForGate(): Promise<void> {
    if (this.gateOpen || this.stopping) return;
    await new Promise<void>((resolve) => this.gateWaiters.push(resolve));
  }

  private inFlight(): number {
    return this.queue.counts.inflight;
  }

  private deadline(): number {
    return Date.now() / 1000 + (this.options.checkpointTimeoutSeconds ?? 60);
  }

  private report(force: boolean): void {
    this.options.progress?.update(this.progressSnapshot(), force);
  }

  private progressSnapshot(): ProgressSnapshot {
    const { counts } = this.queue;
    return {
      total: this.states.size,
      done: counts.done,
      doneBefore: this.doneBefore,
      inFlight: counts.inflight,
      failed: counts.failed,
      checkpoints: this.checkpoints,
      lastCheckpointAt: this.lastCheckpointAt,
      retiresFailing: this.retiresFailing,
    };
  }

  summary(): CollectionSummary {
    const values = [...this.states.values()];
    const done = values.filter((s) => s.status === "done");
    return {
      rows: values.length,
      finished: done.length,
      failed: values.filter((s) => s.status === "failed").length,
      checkpoints: this.checkpoints,
      continued: values.filter((s) => s.continued).length,
      restarted: this.restartedCount,
      usage: { ...this.usage },
      stopped: this.stopping,
      ...(this.records && { records: { ...this.records.stats } }),
      failedRows: values
        .filter((s) => s.status === "failed")
        .slice(0, FAILED_ROWS_LISTED)
        .map((s) => ({ rollout_id: s.row.rolloutId, reason: s.lastFailure ?? "unknown" })),
    };
  }

  /**
   * Mean reward over this collection's finished rows (this run and earlier ones), the rows the
   * summary counts: --out may also hold rows of other task files, which are left out.
   */
  async meanReward(): Promise<number> {
    const results = await readResults(this.options.outPath);
    const rewards = [...results.values()].filter((r) => this.states.has(r.rollout_id)).map((r) => r.reward);
    return rewards.length ? rewards.reduce((a, b) => a + b, 0) / rewards.length : NaN;
  }
}

/** Whether a participant's status shows it still holds checkpoint `id` (parked in it, not idle). */
function heldBy(participants: CtlReplyOf<"status">["participants"], id: string): boolean {
  return participants.some((p) => p.checkpoint_id === id && p.phase !== null && p.phase !== "idle");
}

/** Rejects with `signal`'s reason once it is aborted (at once if it is): a race's losing side never settles. */
function rejectedOnAbort(signal: AbortSignal): Promise<never> {
  return new Promise<never>((_, reject) => {
    if (signal.aborted) reject(signal.reason);
    else signal.addEventListener("abort", () => reject(signal.reason), { once: true });
  });
}

/** Capture keys a warning names inline at most; more are pointed to in their file. */
const KEYS_NAMED = 10;

/**
 * The warning of a start without dispatched.jsonl that leaves the stop checkpoint its Gym is parked
 * in alone: whose it is as far as `state` (its collection.json, undefined when another controller's)
 * tells, and, should it be this collection's after all, what to run. A resume alone would let the
 * attempts its scope names run on beside the rows this collection sends again from attempt 0, so
 * they are retired too (not before the resume: parked processes refuse a retire), this collector
 * stopped meanwhile.
 */
function parkedStopWarning(id: string, state: CollectionState | undefined, statePath: string): string {
  const parked = `the Gym is parked in published stop checkpoint ${id}`;
  const left = `${DISPATCH_LOG_FILE} is not there to name it, so it is left for its controller to stop, and /run is refused admission until then`;
  if (!state) return `${parked}, which holds another controller's state, not a collection's; ${left}`;
  const whose = state.collection
    ? `another collection's (${collectionFlags(fromCollectionFields(state.collection))}), as its ${COLLECTION_STATE_FILE} names it`
    : `whose ${COLLECTION_STATE_FILE} does not name its collection (written by an older collector)`;
  const scope = [...state.continued, ...state.restarted];
  const retire =
    scope.length === 0
      ? ""
      : scope.length <= KEYS_NAMED
        ? `; gym-ckpt retire --episodes ${scope.map(captureKey).join(",")}`
        : `; gym-ckpt retire --episodes @<a JSON array of the ${scope.length} attempts ${statePath} lists under continued and restarted>`;
  return `${parked}, ${whose}; ${left}. If it is this collection's after all (its ${DISPATCH_LOG_FILE} lost), stop this collector and run: gym-ckpt resume ${id}${retire}; then start it again`;
}

/**
 * The refusal of a start without dispatched.jsonl whose Gym is parked in published stop checkpoint
 * `id` with a damaged collection.json (`damage`): whose checkpoint it is, and which attempts it
 * holds, only that file tells. Taken for this collection's, its resume would let attempts run on
 * that no retire names; taken for another's, this collection's rows would be sent again from
 * attempt 0 beside them once anyone resumes it. Neither is guessed: nothing is resumed, retired,
 * written or sent, and the refusal says what would let a start go on.
 */
function damagedParkedStop(id: string, statePath: string, manifestPath: string, damage: CheckpointError): CheckpointError {
  return new CheckpointError(
    "invalid_checkpoint_state",
    `${DISPATCH_LOG_FILE} is not there, and the Gym is parked in published stop checkpoint ${id}, whose ${COLLECTION_STATE_FILE} is damaged (${damage.message}): ` +
      `whose checkpoint it is, and which attempts it holds, cannot be told, so nothing was resumed, retired or sent. ` +
      `Put back ${statePath} (or ${DISPATCH_LOG_FILE}) from a copy and start again; or, if the checkpoint is this collection's, run gym-ckpt resume ${id}, ` +
      `then gym-ckpt retire --episodes with the attempts ${manifestPath} lists under scope and restarts, then start again; if it is another controller's, let that controller stop it first`,
    { cause: damage },
  );
}

function tracer() {
  return trace.getTracer("gym-ckpt");
}
