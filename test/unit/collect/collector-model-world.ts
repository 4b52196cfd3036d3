import { randomBytes } from "node:crypto";
import { readFileSync, statSync } from "node:fs";
import { appendFile, mkdir, readdir, readFile, rm, stat, truncate, writeFile } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { basename, dirname, join } from "node:path";
import pino from "pino";
import { Collector, type CollectorController } from "../../../coordinator/collect/collector.js";
import { DISPATCH_LOG_FILE, DispatchLog } from "../../../coordinator/collect/dispatch-log.js";
import { ProgressReporter, type ProgressSnapshot } from "../../../coordinator/collect/progress-reporter.js";
import { ResultLineSchema } from "../../../coordinator/collect/results-file.js";
import { participantFailurePrefix } from "../../../coordinator/engine/participant-client.js";
import { CheckpointError, finishedWithin, ROLLOUTS_DIR, TRAJECTORY_HEADER, captureKey, rolloutRecordFileName, type EpisodeId, type ErrorCode } from "../../../protocol/index.js";
import { InvariantViolation, type ModelRunWorld } from "../../support/seeded-model-run.js";

/**
 * The collector (coordinator/collect/collector.ts) driven by random steps from a seeded PRNG,
 * against a fake coordinator and Gym that keep the rules the collector relies on (one open
 * checkpoint; retire and forget refused while one is open but a restore; a restore closes the
 * published checkpoint it restores and needs processes that did not resume from it; a retire
 * fences every attempt up to the one named; admission closed while a checkpoint is open) and a
 * real HTTP `/run` server on 127.0.0.1 whose answers the steps script: success, a slow success,
 * HTTP 5xx, a reset connection, a reply past the cap, a malformed reply, no reply (the run timeout).
 * Checkpoints (a step's, a SIGUSR1's racing a SIGTERM's, a timer's) fail at each op with the codes
 * the controller answers, or the collector is killed at one of their ops; restores succeed, fail
 * (`restore_failed`, also at their resume), are refused by live processes, lose their reply (once
 * or on every try) or meet no leader; the collector "crashes" (halted, a new Collector on the same
 * files, its Gym kept or restarted, the last results line maybe torn, dispatched.jsonl maybe
 * naming attempts never sent or ending in a torn line, its restored lines cut short, a temp file of a
 * durable replace left behind; killed again during its start now and then) or stops on SIGTERM
 * (stop checkpoint, then the same); /run stops accepting connections; retires and forgets fail; a
 * new collection (--new-collection, another --out and prefix) abandons the running one. Some
 * worlds write rollout records (--records-dir). After every step, once the collector settled, the
 * invariants docs/collect.md promises (checkSend at each /run, the coordinator's ops, unsettled);
 * the last step drains the collection and checks every row ended exactly once (and, with records,
 * has its record exactly once unless a crash lost it while buffered).
 */

const logger = pino({ level: "silent" });
/** The pauses before sending again, tiny: the order of events, not their pace, is under test. */
const PAUSES = { resendS: 0.005, unresumedS: 0.03, retireS: 0.01, unreachableS: 0.01, unreachableMaxS: 0.04, storageS: 0.02, admissionClosedWarnS: 30 };
const RUN_TIMEOUT_S = 0.4;
const CHECKPOINT_TIMEOUT_S = 0.15;
const MAX_REPLY_BYTES = 2048;
/** How long a step waits for the collector to settle (every reply it got appended, counts caught up). */
const SETTLE_MS = 3_000;

type Outcome = "success" | "slow" | "http500" | "reset" | "oversized" | "malformed" | "hang" | "storage";
const OUTCOMES: [Outcome, number][] = [
  ["success", 40],
  ["slow", 10],
  ["http500", 10],
  ["reset", 10],
  ["oversized", 8],
  ["malformed", 10],
  ["hang", 6],
  ["storage", 6],
];
/** Outcomes the collector must count as a failed attempt (a hang counts once its /run times out; `storage`, a Gym's full disk, does not). */
const COUNTED: ReadonlySet<string> = new Set(["http500", "reset", "oversized", "malformed", "timeout"]);

type CkptOp = "prepare" | "commit" | "publish" | "resume";
/** A checkpoint's scripted fault: the op, and the code it answers (or how it fails). */
type CkptFault = { op: CkptOp; code: ErrorCode | "not_prepared" | "partial"; times: number; landed?: boolean };
const CKPT_FAULTS: CkptFault[] = [
  { op: "prepare", code: "not_prepared", times: 1 },
  { op: "prepare", code: "prepare_incomplete", times: 1 },
  { op: "prepare", code: "unreachable", times: 1 },
  { op: "prepare", code: "checkpoint_conflict", times: 1 },
  { op: "prepare", code: "not_leader", times: 1 },
  { op: "prepare", code: "journal_unavailable", times: 1 },
  { op: "commit", code: "unreachable", times: 1 },
  { op: "commit", code: "storage_error", times: 1 },
  { op: "commit", code: "outcome_unknown", times: 1, landed: true },
  { op: "commit", code: "outcome_unknown", times: 1, landed: false },
  { op: "publish", code: "storage_error", times: 1 },
  { op: "publish", code: "journal_unavailable", times: 1 },
  { op: "publish", code: "outcome_unknown", times: 1, landed: true },
  { op: "publish", code: "outcome_unknown", times: 3, landed: true },
  { op: "publish", code: "outcome_unknown", times: 3, landed: false },
  { op: "resume", code: "partial", times: 1 },
  { op: "resume", code: "outcome_unknown", times: 2 },
  { op: "resume", code: "not_leader", times: 4 },
];
/** How a start's restore goes: `outcome_unknown` and `not_leader` for its first try, or for all three (`…_thrice`). */
type RestoreFault = "ok" | "restore_failed" | "outcome_unknown" | "outcome_unknown_thrice" | "not_leader_thrice";

interface Req {
  seq: number;
  inc: number;
  rollout: string;
  attempt: number;
  res: ServerResponse;
  /** How it ended: an outcome, "admission"/"stale" (answered at once), "timeout" (the client gave up), "dropped". */
  ended?: string;
  /** A success was written and the client alive then. */
  delivered?: boolean;
  /** When its answer was written (performance.now()). */
  answeredAt?: number;
  /** Left unanswered on purpose (the collector's run timeout ends it). */
  hung?: boolean;
  /** Asked for its trajectory (`x-ng-trajectory: 1`, with --records-dir). */
  trajectory?: boolean;
  /** A retire fenced it while its client was still connected (it must have given up on it already). */
  retiredWhileWaited?: boolean;
  closed?: boolean;
}

interface Open {
  id: string;
  phase: "prepared" | "committing" | "committed" | "published" | "restored";
  /** The Gym's epoch when its participants parked in it (a restart of the Gym frees them). */
  gymEpoch: number;
  scope?: string;
  stop?: boolean;
}

export class CollectorWorld implements ModelRunWorld {
  readonly steps: string[] = [];
  private server!: Server;
  private baseUrl!: string;
  /** The rollout ids of --tasks, before any --rollout-id-prefix. */
  private readonly baseRows: string[];
  /** The current collection's rollout ids (its prefix in front). */
  private rows: string[];
  private readonly concurrency: number;
  private readonly maxAttempts: number;
  /** --checkpoint-every, in some worlds: timer checkpoints racing the steps. */
  private readonly every: number | undefined;
  private stepNo = 0;
  /** --records-dir, in some worlds: the rollout records are checked too. */
  private readonly records: { everyRows: number; everySeconds: number } | undefined;
  /** The collection: 1, then 2, 3 after each --new-collection (its own --out and prefix). */
  private collectionNo = 1;
  /** Whether starts pass --new-collection (kept by a job script once used: continues its own log). */
  private newCollection = false;
  /** The abandoned collection's log, while no start of the new one got through (see newCollectionStep). */
  private abandoning: { latest: Map<string, number>; finished: Map<string, number>; outKnown: boolean } | undefined;
  /** Rollouts of a collection abandoned with its --out not there: left retired, not forgotten (documented). */
  private readonly notForgotten = new Set<string>();
  /** Collections abandoned by a --new-collection: their --out, as left, must stay as it is. */
  private readonly abandoned: { rows: string[]; out: string; text: string; finished: Map<string, number> }[] = [];
  /** Rows in --out that a crash may have left without a record (buffered, not yet written, when the collector died). */
  private readonly mayLackRecord = new Set<string>();
  /** The dispatch log's size when a start's restore answered (the restored lines follow it). */
  private readonly restoreLogSize = new Map<number, number>();
  /** A crash armed at the live collector's next /run (crashAtNextDispatch). */
  private dispatchCrash: { inc: number; hit: () => void } | undefined;
  /** Arms a crash at an op of the action unlessKilled runs (a restore arms one at its resume). */
  private armCrash: ((op: string, after: boolean) => void) | undefined;
  /** The op and timing of the last crash unlessKilled armed that killed the collector. */
  private lastCrash: { op: string; after: boolean } | undefined;

  // ---- the collector's incarnations -------------------------------------------------------
  private inc = 0;
  private collector: Collector | undefined;
  private running: Promise<void> | undefined;
  /** Every collector's run(), settled or not: close() waits for them all. */
  private readonly runs = new Map<number, Promise<unknown>>();
  /**
   * What a dead collector's op waits on: no answer while the world runs; refused once it closes, as
   * the process's closing NATS connection would refuse it, so that collector's run() ends and lets go
   * of what it holds in this worker (a `connect` listener on the process-wide HTTP dispatcher).
   */
  private readonly deadConnection: Promise<never>;
  private closeDeadConnection!: () => void;
  private ended = false;
  private snapshot: (() => ProgressSnapshot) | undefined;
  private readonly dead = new Set<number>();
  private runError: unknown;

  // ---- the Gym ----------------------------------------------------------------------------
  private seq = 0;
  private readonly reqs: Req[] = [];
  private gymEpoch = 0;
  /** Highest attempt retired per rollout (a forget lifts it; a Gym restart forgets it). */
  private readonly fence = new Map<string, number>();
  /** Every retire the coordinator took: rollout → highest attempt (never lifted; the model's own memory). */
  private readonly retiredEver = new Map<string, number>();
  /** Attempts a dead collector left running at a live Gym: each must be retired by the next start. */
  private orphans: EpisodeId[] = [];
  /** Checkpoints a participant still holds parked (its resume failed there), with the Gym epoch. */
  private readonly parkedIn = new Map<string, number>();
  private readonly slowTimers = new Set<NodeJS.Timeout>();

  // ---- the coordinator --------------------------------------------------------------------
  private open: Open | null = null;
  private latest: string | null = null;
  private readonly published = new Map<string, { file: string; sha256: string }>();
  /** Gym epoch at each checkpoint's commit: a restore needs processes started after it resumed. */
  private readonly committedAt = new Map<string, number>();
  private fault: CkptFault | undefined;
  private faultLeft = 0;
  private restoreFault: RestoreFault = "ok";
  private restoreFaultLeft = 0;
  /** Rollout → the step of its last retire / forget (every retired rollout is forgotten by the end). */
  private readonly lastRetired = new Map<string, number>();
  private readonly lastForgot = new Map<string, number>();
  private opNo = 0;
  /** Each published checkpoint's collection.json, as the collector wrote it. */
  private readonly collections = new Map<string, { continued: EpisodeId[]; restarted: EpisodeId[] }>();
  /** Collectors whose stop checkpoint was published: no checkpoint of theirs may follow. */
  private readonly stopped = new Set<number>();
  /** rollout@attempt a restore installed (a continuation): its results line says continued. */
  private readonly restoredAttempts = new Set<string>();
  /** The next retires / forgets that fail `unreachable` (a Gym server down). */
  private retireFails = 0;
  /** Until when (Date.now()) every retire fails `unreachable` (a Gym server down longer than --run-timeout-s, now and then). */
  private retireDownUntil = 0;
  private forgetFails = 0;
  private port = 0;
  private readonly servers: Server[] = [];
  private gymDown = false;
  /** Collectors that saw /run go down: a send may then fail on a connection the closing server reset. */
  private readonly sawGymDown = new Set<number>();
  /** The op number of the last forget that failed (the collection may then end with fences left: documented). */
  private lastForgetFailed = -1;
  /** The rows in --out once the live collector started (its progress line's `doneBefore`). */
  private rowsAtStart = 0;
  /** Who set each rollout's fence (see retireOne). */
  private readonly fencedBy = new Map<string, number | "cleanup">();
  /** A crash armed at the next call of a controller op (see controllerFor). */
  private crashAt: { op: string; after: boolean; killed: () => void } | undefined;

  // ---- what the invariants compare against ------------------------------------------------
  /** Rollout ids in --out after the last check (none may go, but a line the model tore). */
  private inFile = new Set<string>();
  /** (inc, rollout) → the attempt its first /run must carry (a restored row's attempt + 1, or + 2 after a failed restore). */
  private readonly expectedFirst = new Map<string, number>();

  constructor(
    private readonly random: () => number,
    private readonly root: string,
    private readonly totalSteps: number,
  ) {
    const n = 3 + Math.floor(random() * 5);
    this.baseRows = Array.from({ length: n }, (_, i) => `r${i}`);
    this.rows = this.baseRows;
    this.concurrency = 1 + Math.floor(random() * 4);
    this.maxAttempts = 2 + Math.floor(random() * 2);
    this.every = random() < 0.3 ? 0.03 + random() * 0.1 : undefined;
    this.records = random() < 0.4 ? { everyRows: 1 + Math.floor(random() * 3), everySeconds: 0.02 + random() * 0.1 } : undefined;
    const records = this.records ? ` records_every_rows=${this.records.everyRows} records_every_s=${this.records.everySeconds.toFixed(3)}` : "";
    this.deadConnection = new Promise<never>((_, reject) => (this.closeDeadConnection = () => reject(new CheckpointError("not_leader", "the controller's NATS connection is closed: the collector is dead"))));
    this.deadConnection.catch(() => undefined); // refused with no op waiting: nothing to report
    this.steps.push(`world: rows=${n} concurrency=${this.concurrency} max_attempts=${this.maxAttempts}${this.every ? ` checkpoint_every=${this.every.toFixed(3)}` : ""}${records}`);
  }

  private get out(): string {
    return join(this.root, this.collectionNo === 1 ? "results.jsonl" : `results-${this.collectionNo}.jsonl`);
  }

  private get prefix(): string {
    return this.collectionNo === 1 ? "" : `c${this.collectionNo}.`;
  }

  private get logPath(): string {
    return join(this.root, DISPATCH_LOG_FILE);
  }

  private get recordsDir(): string {
    return join(this.root, "records");
  }

  private pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.random() * items.length)]!;
  }

  private weighted<T>(items: readonly [T, number][]): T {
    const total = items.reduce((a, [, w]) => a + w, 0);
    let r = this.random() * total;
    for (const [item, w] of items) if ((r -= w) < 0) return item;
    return items[items.length - 1]![0];
  }

  private violation(message: string): never {
    throw new InvariantViolation(`step ${this.stepNo}: ${message}`);
  }

  async init(): Promise<void> {
    await this.listen(0);
    this.port = (this.server.address() as { port: number }).port;
    this.baseUrl = `http://127.0.0.1:${this.port}/run`;
    await this.startCollector("first start");
  }

  async close(): Promise<void> {
    for (const t of this.slowTimers) clearTimeout(t);
    if (this.collector) {
      this.dead.add(this.inc);
      this.killDispatchLog();
      await this.collector.halt();
      await this.killDispatchLogWrites();
      // Its records sink would go on writing into the root being removed (ENOTEMPTY, masking the report).
      await this.killRecordsSink();
    }
    for (const server of this.servers) {
      server.closeAllConnections();
      await new Promise<void>((resolve) => server.close(() => resolve()));
    }
    this.closeDeadConnection();
    const unended = new Set(this.runs.keys());
    for (const [inc, run] of this.runs) void run.then(() => unended.delete(inc));
    // Left running, a collector would hold its `connect` listener on the process-wide dispatcher for the worker's later seeds.
    if (!(await finishedWithin(Promise.all(this.runs.values()), SETTLE_MS))) throw new Error(`the run() of collector(s) ${[...unended].join(", ")} did not end once the world closed`);
  }

  private async listen(port: number): Promise<void> {
    const server = createServer((req, res) => this.onRun(req, res));
    for (let tries = 0; ; tries++) {
      try {
        await new Promise<void>((resolve, reject) => server.once("error", reject).listen(port, "127.0.0.1", () => resolve()));
        break;
      } catch (error) {
        if (tries >= 50) throw error;
        await new Promise((resolve) => setTimeout(resolve, 10));
      }
    }
    this.server = server;
    this.servers.push(server);
  }

  /** The Gym's /run server stops accepting connections (those open stay): sends find no server. */
  private stopListening(): void {
    this.gymDown = true;
    this.sawGymDown.add(this.inc);
    this.server.close();
    this.server.closeIdleConnections();
  }

  // ---- the /run server (the Gym's environment) ---------------------------------------------

  private onRun(req: IncomingMessage, res: ServerResponse): void {
    let data = "";
    req.on("data", (chunk: Buffer) => (data += chunk.toString()));
    req.on("end", () => {
      const inc = Number(new URL(req.url!, "http://x").searchParams.get("inc"));
      const body = JSON.parse(data) as { rollout_id: string; attempt: number };
      // A request of a dead collector that was still on its way: its process is gone with it.
      if (this.dead.has(inc)) return void res.socket?.destroy();
      // The collector dies as this /run goes out (crashAtNextDispatch): logged, never received.
      if (this.dispatchCrash?.inc === inc) {
        this.dead.add(inc);
        this.steps.push(`  collector ${inc} died sending ${captureKey(body)}, logged, not received`);
        const { hit } = this.dispatchCrash;
        this.dispatchCrash = undefined;
        hit();
        return void res.socket?.destroy();
      }
      const r: Req = { seq: ++this.seq, inc, rollout: body.rollout_id, attempt: body.attempt, res, ...(req.headers[TRAJECTORY_HEADER] === "1" && { trajectory: true }) };
      try {
        this.checkSend(r);
      } catch (error) {
        this.runError ??= error;
      }
      this.reqs.push(r);
      res.on("close", () => {
        r.closed = true;
        if (!res.writableFinished && (r.ended === undefined || r.ended === "slow")) r.ended = this.dead.has(inc) ? "dropped" : "timeout";
      });
      if (this.admissionClosed()) return this.answer(r, "admission", 409, { error: { code: "admission_closed", detail: "a checkpoint is open" } });
      if ((this.fence.get(r.rollout) ?? -1) >= r.attempt) return this.answer(r, "stale", 409, { error: { code: "stale_attempt", detail: `attempt ${r.attempt} is fenced` } });
    });
  }

  /** Episodes are parked in a committed checkpoint (a timer's, racing the steps): none replies until its resume. */
  private parked(): boolean {
    return this.open !== null && ["committing", "committed", "published"].includes(this.open.phase) && this.open.gymEpoch === this.gymEpoch;
  }

  private admissionClosed(): boolean {
    return this.open !== null && (this.open.phase === "restored" || this.open.gymEpoch === this.gymEpoch);
  }

  private answer(r: Req, how: string, status: number, body: unknown): void {
    r.ended = how;
    r.answeredAt = performance.now();
    if (how === "success" && !this.dead.has(r.inc)) r.delivered = true;
    // Asked for (with --records-dir): the episode as a record's graph (RunTrajectorySchema).
    if (how === "success" && r.trajectory && typeof body === "object" && body !== null) {
      const { reward } = body as { reward: number };
      body = { ...body, trajectory: { task_name: r.rollout, prompt: null, nodes: [], reward, turns: 0, stop_condition: null, is_completed: true, replay: null } };
    }
    r.res.writeHead(status, { "content-type": "application/json" });
    r.res.end(typeof body === "string" ? body : JSON.stringify(body));
  }

  /** Requests the Gym still runs (no reply yet, client connected or an orphan's). */
  private held(): Req[] {
    return this.reqs.filter((r) => r.ended === undefined);
  }

  private reply(r: Req, outcome: Outcome): void {
    switch (outcome) {
      case "success":
        return this.answer(r, "success", 200, { reward: Math.round(this.random() * 100) / 100, usage: { model_calls_kept: 1 } });
      case "slow": {
        r.ended = "slow";
        const t = setTimeout(() => {
          this.slowTimers.delete(t);
          if (r.res.destroyed) return;
          this.answer(r, "success", 200, { reward: 0.5 });
        }, 5 + this.random() * 60);
        this.slowTimers.add(t);
        return;
      }
      case "http500":
        return this.answer(r, "http500", 500, { error: { code: "internal_error", detail: "boom" } });
      case "reset":
        r.ended = "reset";
        r.res.socket?.destroy();
        return;
      case "oversized":
        return this.answer(r, "oversized", 200, JSON.stringify({ reward: 1, pad: "x".repeat(MAX_REPLY_BYTES * 2) }));
      case "malformed":
        return this.answer(r, "malformed", 200, this.random() < 0.5 ? "{not json" : { reward: "high" });
      case "storage":
        return this.answer(r, "storage", 507, { error: { code: "storage_error", detail: "activate: policy: the capture ledger cannot be written (ENOSPC)" } });
      case "hang":
        return; // the collector's run timeout ends it
    }
  }

  /** The Gym restarts: what it ran is gone (connections reset), its fences and parked processes with it. */
  private restartGym(): void {
    this.gymEpoch++;
    for (const r of this.held()) {
      r.ended = this.dead.has(r.inc) ? "dropped" : "reset";
      r.res.socket?.destroy();
    }
    this.fence.clear();
    this.parkedIn.clear();
    this.orphans = [];
  }

  // ---- the fake coordinator ---------------------------------------------------------------

  private controllerFor(inc: number): CollectorController {
    const ops: Record<string, (req: never) => Promise<unknown>> = {
      prepare: async (req: { checkpoint_id: string }) => {
        if (this.stopped.has(inc)) this.runError ??= new InvariantViolation(`step ${this.stepNo}: collector ${inc} prepared ${req.checkpoint_id} after its stop checkpoint`);
        this.scripted("prepare", () => (this.fault?.code === "outcome_unknown" ? (this.open = { id: req.checkpoint_id, phase: "prepared", gymEpoch: this.gymEpoch }) : undefined));
        if (this.open) throw new CheckpointError("checkpoint_conflict", `checkpoint ${this.open.id} is open`);
        this.open = { id: req.checkpoint_id, phase: "prepared", gymEpoch: this.gymEpoch };
        if (this.takeFault("prepare", "not_prepared")) return { prepared: false, blockers: [{ instance: "e1", blockers: 1 }], restarts: [], stopped_at: null };
        // Now and then the environment names an episode it restarts (it parks at its next boundary).
        const restarts = this.random() < 0.2 ? this.held().filter((r) => r.inc === inc).slice(0, 1).map((r) => captureKey({ rollout_id: r.rollout, attempt: r.attempt })) : [];
        return { prepared: true, blockers: [], restarts, stopped_at: null };
      },
      commit: async (req: { checkpoint_id: string; episode_ids: EpisodeId[]; stop: boolean }) => {
        if (this.open?.id === req.checkpoint_id) this.open.stop = req.stop;
        if (this.open?.id === req.checkpoint_id && this.open.phase === "committed") return this.commitReply(req);
        if (this.open?.id !== req.checkpoint_id || this.open.phase !== "prepared") throw new CheckpointError("invalid_phase", `commit of ${req.checkpoint_id}: not prepared`);
        this.scripted("commit", () => {
          this.open!.phase = this.fault?.landed ? "committed" : "committing";
          if (this.fault?.landed) this.committedAt.set(req.checkpoint_id, this.gymEpoch);
        });
        this.open.phase = "committed";
        // A row a restore continued and not sent yet is in the scope (else a crash now would drop its record).
        for (const [key, attempt] of this.expectedFirst) {
          const [of, rollout_id] = key.split("/") as [string, string];
          if (Number(of) !== inc || !this.restoredAttempts.has(`${rollout_id}@${attempt}`) || this.inFile.has(rollout_id)) continue;
          // Sent already (received here, or lost on a connection the closing /run server reset).
          if (this.sawGymDown.has(inc) || this.reqs.some((r) => r.inc === inc && r.rollout === rollout_id)) continue;
          if (!req.episode_ids.some((e) => e.rollout_id === rollout_id && e.attempt === attempt)) {
            this.runError ??= new InvariantViolation(`step ${this.stepNo}: checkpoint ${req.checkpoint_id} leaves out ${captureKey({ rollout_id, attempt })}, restored and not sent yet`);
          }
        }
        this.committedAt.set(req.checkpoint_id, this.gymEpoch);
        return this.commitReply(req);
      },
      publish: async (req: { checkpoint_id: string; controller_state: { file: string; sha256: string } }) => {
        if (this.published.get(req.checkpoint_id)?.sha256 === req.controller_state.sha256 && (this.open?.id !== req.checkpoint_id || this.open.phase === "published")) {
          if (this.open?.id === req.checkpoint_id) return {};
          throw new CheckpointError("invalid_phase", `${req.checkpoint_id} is not open`);
        }
        if (this.open?.id !== req.checkpoint_id || this.open.phase !== "committed") throw new CheckpointError("invalid_phase", `publish of ${req.checkpoint_id}: not committed`);
        this.scripted("publish", () => (this.fault?.landed ? this.publish(inc, req.checkpoint_id, req.controller_state) : undefined));
        this.publish(inc, req.checkpoint_id, req.controller_state);
        return {};
      },
      resume: async (req: { checkpoint_id: string }) => {
        // A restore whose processes restarted since: its clean-up retires attempt + 1 of its scope, and everyone resumes.
        if (this.open?.id === req.checkpoint_id && this.open.phase === "restored" && this.open.gymEpoch !== this.gymEpoch) {
          const scope = JSON.parse(this.open.scope ?? "[]") as EpisodeId[];
          this.open = null;
          for (const e of scope) {
            this.retireOne({ rollout_id: e.rollout_id, attempt: e.attempt + 1 }, "cleanup");
            if (this.expectedFirst.has(`${inc}/${e.rollout_id}`)) this.expectedFirst.set(`${inc}/${e.rollout_id}`, e.attempt + 2);
          }
          throw new CheckpointError("restore_failed", "a participant restarted since it restored");
        }
        if (this.open?.id === req.checkpoint_id) {
          this.scripted("resume", () => {
            if (this.fault?.code !== "partial") return;
            this.open = null;
            this.parkedIn.set(req.checkpoint_id, this.gymEpoch);
          });
          this.open = null;
        }
        this.parkedIn.delete(req.checkpoint_id);
        return {};
      },
      restore: async (req: { checkpoint_id: string; episode_ids: EpisodeId[] }) => {
        this.log(inc, `restore ${req.checkpoint_id} ${keys(req.episode_ids)}`);
        this.checkRestoreScope(req.checkpoint_id, req.episode_ids);
        const scope = JSON.stringify(req.episode_ids);
        // No leader: it never ran.
        if (this.restoreFault === "not_leader_thrice" && this.restoreFaultLeft > 0) {
          this.restoreFaultLeft--;
          throw new CheckpointError("not_leader", "no coordinator is the ready leader");
        }
        // docs/collect.md: a restore left open is resumed, or sent again with the same scope, never
        // with another (it refuses that, and would stay open, every server parked).
        if (this.open?.phase === "restored" && this.open.id === req.checkpoint_id && this.open.scope !== scope) {
          this.runError ??= new InvariantViolation(`step ${this.stepNo}: restore of ${req.checkpoint_id} with scope ${keys(req.episode_ids)}, while the restore of it left open has ${keys(JSON.parse(this.open.scope ?? "[]") as EpisodeId[])}`);
        }
        const lost = this.restoreFault.startsWith("outcome_unknown") && this.restoreFaultLeft > 0;
        if (this.open?.phase === "restored" && this.open.id === req.checkpoint_id && this.open.scope === scope) {
          if (!lost) return this.restored(inc, req);
          this.restoreFaultLeft--;
          throw new CheckpointError("outcome_unknown", "the restore's reply was lost again");
        }
        if (this.open?.phase === "published" && this.open.id === req.checkpoint_id && this.open.gymEpoch !== this.gymEpoch) this.open = null;
        if (this.open) throw new CheckpointError("invalid_phase", `checkpoint ${this.open.id} is open (${this.open.phase})`);
        // Processes that resumed from it (not restarted since its commit) refuse it: nothing installed.
        if ((this.committedAt.get(req.checkpoint_id) ?? -1) >= this.gymEpoch) {
          this.expectAfterFailedRestore(inc, req.episode_ids);
          throw new CheckpointError("stale_checkpoint", `the processes already resumed from ${req.checkpoint_id}`);
        }
        // A restore into a retired attempt (a failed restore's clean-up fenced it) is refused: nothing installed.
        const fenced = req.episode_ids.find((e) => (this.fence.get(e.rollout_id) ?? -1) >= e.attempt + 1);
        if (fenced) {
          this.expectAfterFailedRestore(inc, req.episode_ids);
          throw new CheckpointError("stale_attempt", `${captureKey({ rollout_id: fenced.rollout_id, attempt: fenced.attempt + 1 })} is retired`);
        }
        if (lost) {
          this.restoreFaultLeft--;
          this.openRestore(req, scope);
          throw new CheckpointError("outcome_unknown", "the restore's reply was lost");
        }
        if (this.restoreFaultLeft > 0 && this.restoreFault === "restore_failed") {
          this.restoreFaultLeft--;
          // The clean-up: attempt + 1 retired wherever it may be installed, everyone resumed.
          for (const e of req.episode_ids) this.retireOne({ rollout_id: e.rollout_id, attempt: e.attempt + 1 }, "cleanup");
          this.expectAfterFailedRestore(inc, req.episode_ids);
          throw new CheckpointError("restore_failed", "a participant failed to restore");
        }
        this.openRestore(req, scope);
        return this.restored(inc, req);
      },
      retire: async (req: { episode_ids: EpisodeId[] }) => {
        this.log(inc, `retire ${keys(req.episode_ids)}`);
        if (this.open && this.open.phase !== "restored") throw new CheckpointError("invalid_phase", `retire is refused while ${this.open.id} is open`);
        if ((this.retireFails > 0 && this.retireFails--) || Date.now() < this.retireDownUntil) throw new CheckpointError("unreachable", "retire failed on 1 participant(s): e1 (unreachable)");
        for (const e of req.episode_ids) this.retireOne(e, inc);
        return { participants: [] };
      },
      forget: async (req: { rollout_ids: string[] }) => {
        if (this.open && this.open.phase !== "restored") throw new CheckpointError("invalid_phase", `forget is refused while ${this.open.id} is open`);
        if (this.forgetFails > 0) {
          this.forgetFails--;
          this.lastForgetFailed = ++this.opNo;
          throw new CheckpointError("unreachable", "forget failed on 1 participant(s): e1 (unreachable)");
        }
        for (const id of req.rollout_ids) {
          this.fence.delete(id);
          this.lastForgot.set(id, ++this.opNo);
        }
        return { participants: [] };
      },
      list: async () => ({ latest: this.latest, checkpoints: [] }),
      status: async () => {
        const participants = [];
        if (this.open && (this.open.phase === "committed" || this.open.phase === "published") && this.open.gymEpoch === this.gymEpoch) {
          participants.push({ kind: "environment", instance: "e1", phase: "committed", checkpoint_id: this.open.id });
        }
        for (const [id, epoch] of this.parkedIn) if (epoch === this.gymEpoch) participants.push({ kind: "resources", instance: "s1", phase: "committed", checkpoint_id: id });
        return { checkpoint: this.open && { checkpoint_id: this.open.id, phase: this.open.phase }, participants };
      },
      get: async (id: string) => ({ latest: id === this.latest, manifest: { controller_state: this.published.get(id) } }),
    };
    // A dead collector sends nothing: whatever it still tries never arrives.
    // A crash armed at an op (crashAt) kills it there, before the op reaches the coordinator or
    // once it took effect there (its reply lost with the process).
    const never = this.deadConnection;
    return new Proxy({} as CollectorController, {
      get: (_t, op) => async (req: never) => {
        if (this.dead.has(inc)) return never;
        const crash = this.crashAt;
        if (crash?.op !== op) return ops[String(op)]!(req);
        this.crashAt = undefined;
        // Its effect is taken synchronously (every fake op changes the state before its first await).
        if (crash.after) ops[String(op)]!(req).catch(() => undefined);
        this.dead.add(inc);
        this.log(inc, `killed at its ${String(op)} (${crash.after ? "after it took effect" : "before it was sent"})`);
        crash.killed();
        return never;
      },
    });
  }

  /** Runs `action` of the live collector; undefined when it ran to its end, "killed" when a crash armed at one of its ops killed the collector. */
  private async unlessKilled<T>(action: () => Promise<T>, op: string | undefined): Promise<T | "killed"> {
    let killed = false;
    let wake!: () => void;
    const crashed = new Promise<"killed">((resolve) => (wake = () => resolve("killed")));
    const arm = (op: string, after: boolean) => (this.crashAt = { op, after, killed: () => ((killed = true), (this.lastCrash = { op, after }), wake()) });
    if (op !== undefined) arm(op, this.random() < 0.5);
    this.armCrash = arm;
    try {
      const result = await Promise.race([action(), crashed]);
      // Killed by an op the action left running in the background (a forget it queued), before this line.
      return killed ? "killed" : result;
    } finally {
      this.crashAt = undefined;
      this.armCrash = undefined;
    }
  }

  /** Throws the scripted fault of `op` (after `effect`, what the op did before it failed), if one is due. */
  private scripted(op: CkptOp, effect: () => unknown): void {
    if (this.fault?.op !== op || this.faultLeft <= 0 || this.fault.code === "not_prepared") return;
    this.faultLeft--;
    effect();
    const code = this.fault.code === "partial" ? "unreachable" : this.fault.code;
    const detail = this.fault.code === "partial" ? `${participantFailurePrefix("resume")}1 participant(s): s1 (unreachable)` : `scripted ${op} fault`;
    throw new CheckpointError(code, detail);
  }

  private takeFault(op: CkptOp, code: string): boolean {
    if (this.fault?.op !== op || this.fault.code !== code || this.faultLeft <= 0) return false;
    this.faultLeft--;
    return true;
  }

  private async commitReply(req: { checkpoint_id: string; episode_ids: EpisodeId[] }) {
    const dir = join(this.root, req.checkpoint_id);
    await mkdir(dir, { recursive: true });
    // The environment exports the episodes it holds: a /run with no reply yet whose client is connected.
    const holding = new Set(this.held().filter((r) => !r.closed && !r.retiredWhileWaited && !this.dead.has(r.inc)).map((r) => captureKey({ rollout_id: r.rollout, attempt: r.attempt })));
    const exported = req.episode_ids.map(captureKey).filter((k) => holding.has(k));
    return { checkpoint_id: req.checkpoint_id, checkpoint_dir: dir, participants: [{ kind: "environment", instance: "e1", episode_ids: exported }] };
  }

  private publish(inc: number, id: string, state: { file: string; sha256: string }): void {
    const collection = JSON.parse(readFileSync(join(this.root, id, "collection.json"), "utf8")) as { continued: EpisodeId[]; restarted: EpisodeId[] };
    this.collections.set(id, collection);
    // A row is never both finished and continued.
    for (const e of collection.continued) {
      const finished = this.reqs.some((r) => r.inc === inc && r.rollout === e.rollout_id && r.attempt === e.attempt && r.ended === "success" && r.delivered);
      if (finished || this.inFile.has(e.rollout_id)) this.runError ??= new InvariantViolation(`step ${this.stepNo}: checkpoint ${id} continues ${captureKey(e)}, whose /run replied with success`);
    }
    if (this.open?.stop) this.stopped.add(inc);
    this.latest = id;
    this.published.set(id, state);
    this.open!.phase = "published";
  }

  private openRestore(req: { checkpoint_id: string }, scope: string): void {
    this.open = { id: req.checkpoint_id, phase: "restored", gymEpoch: this.gymEpoch, scope };
  }

  private restored(inc: number, req: { checkpoint_id: string; episode_ids: EpisodeId[] }) {
    // The log as the start wrote it: the restored attempts are appended after this, and now and
    // then the start dies before the resume that follows (see crashDuringStart).
    this.restoreLogSize.set(inc, statSync(this.logPath).size);
    if (this.armCrash && !this.crashAt && req.episode_ids.length && this.random() < 0.25) this.armCrash("resume", false);
    for (const e of req.episode_ids) {
      this.expectedFirst.set(`${inc}/${e.rollout_id}`, e.attempt + 1);
      this.restoredAttempts.add(`${e.rollout_id}@${e.attempt + 1}`);
    }
    return { checkpoint_id: req.checkpoint_id, participants: [] };
  }

  private expectAfterFailedRestore(inc: number, episodes: EpisodeId[]): void {
    for (const e of episodes) this.expectedFirst.set(`${inc}/${e.rollout_id}`, e.attempt + 2);
  }

  /** `by`: the collector that sent the retire, or a restore's clean-up (which a dying collector may never learn of). */
  private retireOne(e: EpisodeId, by: number | "cleanup"): void {
    if ((this.fence.get(e.rollout_id) ?? -1) < e.attempt) this.fencedBy.set(e.rollout_id, by);
    this.fence.set(e.rollout_id, Math.max(this.fence.get(e.rollout_id) ?? -1, e.attempt));
    this.retiredEver.set(e.rollout_id, Math.max(this.retiredEver.get(e.rollout_id) ?? -1, e.attempt));
    this.lastRetired.set(e.rollout_id, ++this.opNo);
    // The Gym stops what it runs of the fenced attempts. One whose client is still connected is
    // left to that client: the collector retires only attempts it gave up on, so it closes (checked).
    for (const r of this.held()) {
      if (r.rollout !== e.rollout_id || r.attempt > e.attempt) continue;
      if (!this.dead.has(r.inc) && !r.closed) {
        r.retiredWhileWaited = true;
        continue;
      }
      r.ended = this.dead.has(r.inc) ? "dropped" : "retired";
      r.res.socket?.destroy();
    }
  }

  private log(inc: number, what: string): void {
    this.steps.push(`    [collector ${inc}] ${what}`);
  }

  // ---- the collector's lifecycle ----------------------------------------------------------

  private async startCollector(why: string, crashes = 0): Promise<void> {
    const inc = ++this.inc;
    this.restoreFault = this.weighted<RestoreFault>([
      ["ok", 6],
      ["restore_failed", 3],
      ["outcome_unknown", 2],
      ["outcome_unknown_thrice", 1],
      ["not_leader_thrice", 1],
    ]);
    this.restoreFaultLeft = this.restoreFault === "ok" ? 0 : this.restoreFault.endsWith("thrice") ? 3 : 1;
    this.steps.push(`  start collector ${inc} (${why}; a restore would be: ${this.restoreFault}; gym epoch ${this.gymEpoch})`);
    const world = this;
    const progress = new (class extends ProgressReporter {
      override start(source: () => ProgressSnapshot): void {
        world.snapshot = source;
      }
      override update(): void {}
    })(process.stdout);
    // A job script that passed --new-collection keeps it on its restarts now and then: its own log is continued.
    // Until a start got through, the log is still the abandoned collection's: the flag is needed.
    const newCollection = this.newCollection && (this.abandoning !== undefined || this.random() < 0.5);
    const collector = new Collector({
      rows: this.rows.map((rolloutId) => ({ rolloutId, task: { q: rolloutId } })),
      runUrl: `${this.baseUrl}?inc=${inc}`,
      outPath: this.out,
      tasksPath: join(this.root, "tasks.jsonl"),
      ...(this.prefix && { rolloutIdPrefix: this.prefix }),
      ...(newCollection && { newCollection }),
      ...(this.records && { records: { dir: this.recordsDir, env: "gym", kind: "eval" as const, everyRows: this.records.everyRows, everySeconds: this.records.everySeconds } }),
      checkpointDir: this.root,
      controller: this.controllerFor(inc),
      concurrency: this.concurrency,
      maxAttempts: this.maxAttempts,
      ...(this.every && { checkpointEverySeconds: this.every }),
      runTimeoutSeconds: RUN_TIMEOUT_S,
      checkpointTimeoutSeconds: CHECKPOINT_TIMEOUT_S,
      maxRunReplyBytes: MAX_REPLY_BYTES,
      progress,
      logger,
      retryPauses: PAUSES,
    });
    this.collector = collector;
    if (this.gymDown) this.sawGymDown.add(inc);
    this.ended = false;
    this.snapshot = undefined;
    // Now and then the start is killed at one of its ops (a second crash, as `kill-collector-twice`).
    const crashOp = crashes < 2 && this.random() < 0.15 ? this.pick(["status", "retire", "restore", "resume", "forget"]) : undefined;
    const logBefore = await readFile(this.logPath, "utf8").catch(() => "");
    try {
      if ((await this.unlessKilled(() => collector.start(), crashOp)) === "killed") {
        await this.kill();
        await this.crashDuringStart(inc, logBefore);
        if (this.random() < 0.3) this.restartGym();
        return this.startCollector(`restart after a crash during the start (gym epoch ${this.gymEpoch})`, crashes + 1);
      }
    } catch (error) {
      // docs/collect.md: a restore refused not_leader on every try never ran; the start fails, and the next one restores the same checkpoint.
      // So does one whose retire found a participant unreachable for --run-timeout-s.
      const retiresDown = error instanceof CheckpointError && error.code === "unreachable" && Date.now() - this.retireDownUntil < 100;
      if (retiresDown || (error instanceof CheckpointError && error.code === "not_leader" && this.restoreFault === "not_leader_thrice")) {
        await this.kill();
        return this.startCollector("started again after a start refused not_leader", crashes + 1);
      }
      this.violation(`collector ${inc}'s start failed: ${String(error)}`);
    }
    // --new-collection (docs/collect.md): the attempts the abandoned collection left unfinished by
    // its own --out are retired, and those rollouts forgotten with the ones it finished as a later
    // attempt: no fence of it is left (the Gym's faults were lifted for this start).
    // Unless its --out is not there (a collection makes it before its first /run, so only one that
    // never got that far): which rows finished is unknown then, and only attempts that certainly
    // never finished are retired; one still running at the Gym is left running there ("gym-ckpt
    // retire stops it").
    if (this.abandoning && !this.abandoning.outKnown) {
      const { latest } = this.abandoning;
      for (const id of latest.keys()) this.notForgotten.add(id);
      this.orphans = this.orphans.filter((o) => !latest.has(o.rollout_id));
      this.abandoning = undefined;
    }
    if (this.abandoning) {
      for (const [id, attempt] of this.abandoning.latest) {
        if (!this.abandoning.finished.has(id) && (this.retiredEver.get(id) ?? -1) < attempt) this.violation(`--new-collection left ${captureKey({ rollout_id: id, attempt })}, unfinished in the abandoned collection, unretired`);
        if (this.fence.has(id)) this.violation(`--new-collection left the abandoned collection's rollout ${id} fenced (up to attempt ${this.fence.get(id)})`);
      }
      this.abandoning = undefined;
    }
    // Every attempt a dead collector left running at a live Gym is retired by the start.
    for (const o of this.orphans) {
      if ((this.retiredEver.get(o.rollout_id) ?? -1) < o.attempt) this.violation(`the start left ${captureKey(o)}, which its predecessor left running, unretired`);
    }
    this.orphans = [];
    this.rowsAtStart = (await this.readOut()).size;
    const run = collector.run();
    this.runs.set(inc, run.catch(() => undefined));
    this.running = run.then(
      (summary) => {
        if (this.inc === inc) this.ended = true;
        this.log(inc, `run ended: ${JSON.stringify({ finished: summary.finished, failed: summary.failed, stopped: summary.stopped })}`);
      },
      (error: unknown) => {
        this.runError ??= new InvariantViolation(`collector ${inc}'s run failed: ${String(error)}`);
      },
    );
  }

  /**
   * What a start killed at one of its ops may leave beyond that: killed before the resume of its
   * restore, the restored attempts were being appended (in several writes when there are many), so
   * the log may end anywhere in them (docs/collect.md: any restored attempt logged shows the restore
   * landed); killed before its log was replaced, the replace may have been under way (the old log
   * whole, a part of the new one's temp file beside it).
   */
  private async crashDuringStart(inc: number, logBefore: string): Promise<void> {
    const crash = this.lastCrash!;
    const text = await readFile(this.logPath, "utf8").catch(() => "");
    const size = this.restoreLogSize.get(inc);
    const total = Buffer.byteLength(text);
    if (crash.op === "resume" && !crash.after && size !== undefined && total > size && this.random() < 0.7) {
      const cut = size + Math.floor(this.random() * (total - size));
      await truncate(this.logPath, cut);
      this.steps.push(`  the crash cut the restored lines of dispatched.jsonl at ${cut - size}/${total - size} bytes`);
    } else if (text && text === logBefore && this.random() < 0.3) {
      await this.leaveTempOf(this.logPath, text);
      this.steps.push("  the crash came during the replace of dispatched.jsonl: a part of its temp file left");
    }
  }

  /**
   * A new collection in the same root (docs/collect.md, Another collection in the same root): the
   * running collector dies, and the next job starts with --new-collection, its own --out and
   * --rollout-id-prefix. The earlier collection is abandoned: its unfinished attempts retired and
   * forgotten (checked once a start got through), its --out left as it is, none of its rows sent
   * or restored again (checkSend: not a row of --tasks any more), its records never duplicated.
   */
  private async newCollectionStep(): Promise<void> {
    const tear = this.random() < 0.3;
    const next = this.collectionNo + 1;
    this.steps.push(`crash collector ${this.inc}${tear ? " (mid-append)" : ""}; a new collection in the same root: --new-collection --out results-${next}.jsonl --rollout-id-prefix c${next}.`);
    await this.kill();
    if (tear) await this.tearLastLine();
    // The Gym answers its retires and forgets (a start failing on them is modelled elsewhere).
    this.retireFails = this.forgetFails = 0;
    this.retireDownUntil = 0;
    const outKnown = await stat(this.out).then(() => true, () => false);
    const text = await readFile(this.out, "utf8").catch(() => "");
    const finished = new Map<string, number>();
    // As its restart would read it: a last line that is a whole record which only lost its newline counts.
    for (const line of text.split("\n")) {
      const parsed = ResultLineSchema.safeParse(jsonOrUndefined(line));
      if (parsed.success) finished.set(parsed.data.rollout_id, parsed.data.attempt);
    }
    const history = await DispatchLog.read(this.logPath);
    this.abandoned.push({ rows: this.rows, out: this.out, text, finished });
    this.abandoning = { latest: history?.latest ?? new Map(), finished, outKnown };
    this.collectionNo = next;
    this.rows = this.baseRows.map((id) => `${this.prefix}${id}`);
    this.inFile = new Set();
    this.newCollection = true;
    await this.startCollector("a new collection");
  }

  /** The process dies: no reply taken any more, nothing sent; what it ran at the Gym keeps running there. */
  private async kill(): Promise<void> {
    const inc = this.inc;
    this.dead.add(inc);
    this.killDispatchLog();
    await this.collector!.halt();
    await this.killDispatchLogWrites();
    await this.killRecordsSink();
    for (const r of this.held()) {
      if (r.inc !== inc) continue;
      this.orphans.push({ rollout_id: r.rollout, attempt: r.attempt });
      r.res.socket?.destroy();
    }
    for (const r of this.reqs) if (r.inc === inc && r.ended === "slow") r.ended = "dropped";
  }

  /**
   * A SIGKILL ends the collector's writes to dispatched.jsonl: halted, it would still log a send or a
   * checkpoint already on its way (past the line of the model's crash, which may tear the log).
   */
  private killDispatchLog(): void {
    const log = (this.collector as unknown as { log?: { append: unknown; replace: unknown } }).log;
    if (!log) return;
    log.append = log.replace = () => new Promise<never>(() => undefined);
  }

  /** …once the group write under way (if any) has ended, as the process died just after it. */
  private async killDispatchLogWrites(): Promise<void> {
    const log = (this.collector as unknown as { log?: { writing: boolean } }).log;
    for (const until = Date.now() + 2_000; log?.writing && Date.now() < until; ) await new Promise((resolve) => setTimeout(resolve, 1));
  }

  /**
   * A SIGKILL takes the collector's rollout-records sink with it: a flush under way is let finish
   * (the process died just after it), what is still buffered is lost, and no timer flushes later
   * (halt() leaves the sink running, as the CLI flushes after it). The rows whose records it still
   * buffered stay without one (docs/collect.md: "A SIGKILLed collector loses the rows still buffered").
   */
  private async killRecordsSink(): Promise<void> {
    const sink = (this.collector as unknown as { records?: { tail: Promise<void>; buffer: { info?: Record<string, unknown> }[]; timer?: NodeJS.Timeout; closed: boolean } }).records;
    if (!sink) return;
    for (let tail = sink.tail; ; tail = sink.tail) {
      await tail.catch(() => undefined);
      if (sink.tail === tail) break;
    }
    clearTimeout(sink.timer);
    sink.timer = undefined;
    for (const record of sink.buffer) this.mayLackRecord.add(String(record.info?.["rollout_id"]));
    sink.buffer = [];
    sink.closed = true;
  }

  // ---- steps ------------------------------------------------------------------------------

  async step(): Promise<void> {
    this.stepNo++;
    if (this.stepNo === this.totalSteps) return this.drain();
    const held = this.parked() ? [] : this.answerable();
    const kind = this.weighted<string>([
      ["answer", held.length ? 60 : 0],
      ["wait", 10],
      ["checkpoint", 10],
      ["crash", 5],
      ["sigterm", 3],
      ["gym-restart", 2],
      ["new-collection", this.collectionNo < 3 ? 1 : 0],
      ["retire-faults", 2],
      ["gym-down", this.gymDown ? 0 : 2],
      ["gym-up", this.gymDown ? 8 : 0],
    ]);
    switch (kind) {
      case "answer": {
        const r = this.pick(held);
        const outcome = this.weighted(OUTCOMES);
        this.steps.push(`answer ${captureKey({ rollout_id: r.rollout, attempt: r.attempt })} of collector ${r.inc}: ${outcome}`);
        if (outcome === "hang") r.hung = true;
        this.reply(r, outcome);
        break;
      }
      case "wait": {
        const ms = Math.floor(this.random() * 80);
        this.steps.push(`wait ${ms} ms`);
        await new Promise((resolve) => setTimeout(resolve, ms));
        break;
      }
      case "checkpoint":
        await this.checkpoint(false);
        break;
      case "sigterm":
        await this.checkpoint(true);
        break;
      case "crash": {
        if (this.random() < 0.3 && (await this.crashAtNextDispatch())) {
          await this.kill();
          if (this.random() < 0.5) await this.tearDispatchLog();
          await this.startCollector("restart after a crash mid-dispatch");
          break;
        }
        const gymToo = this.random() < 0.4;
        const tear = this.random() < 0.4;
        this.steps.push(`crash collector ${this.inc}${gymToo ? " and the Gym" : ""}${tear ? " (mid-append)" : ""}`);
        await this.kill();
        if (tear) await this.tearLastLine();
        if (this.random() < 0.3) await this.tearDispatchLog();
        if (gymToo) this.restartGym();
        await this.startCollector("restart after a crash");
        break;
      }
      case "retire-faults":
        this.retireFails = 1 + Math.floor(this.random() * 4);
        this.forgetFails = Math.floor(this.random() * 3);
        if (this.random() < 0.3) this.retireDownUntil = Date.now() + 1000 * (RUN_TIMEOUT_S / 2 + this.random() * RUN_TIMEOUT_S);
        this.steps.push(`the next ${this.retireFails} retires and ${this.forgetFails} forgets fail unreachable${this.retireDownUntil > Date.now() ? `, every retire for ${this.retireDownUntil - Date.now()} ms` : ""}`);
        break;
      case "gym-down":
        this.steps.push("/run accepts no connections");
        this.stopListening();
        break;
      case "gym-up":
        this.steps.push("/run accepts connections again");
        await this.listen(this.port);
        this.gymDown = false;
        break;
      case "new-collection":
        await this.newCollectionStep();
        break;
      case "gym-restart":
        this.steps.push("the Gym restarts");
        this.restartGym();
        break;
    }
    await this.check();
  }

  /** Requests of the live collector a step may answer. */
  private answerable(): Req[] {
    return this.held().filter((r) => r.inc === this.inc && !this.dead.has(r.inc) && !r.closed && !r.hung && !r.retiredWhileWaited);
  }

  private async checkpoint(stop: boolean): Promise<void> {
    const fault = this.random() < 0.5 ? this.pick(CKPT_FAULTS) : undefined;
    this.fault = fault;
    this.faultLeft = fault?.times ?? 0;
    this.steps.push(`${stop ? "SIGTERM: stop checkpoint" : "checkpoint"}${fault ? ` (${fault.op} fails ${fault.code} ×${fault.times}${fault.landed === undefined ? "" : fault.landed ? ", landed" : ", not landed"})` : ""}`);
    const collector = this.collector!;
    // A SIGUSR1 just before the SIGTERM: its checkpoint, still waiting for the lock, gives way to the stop.
    if (stop && this.random() < 0.3) {
      this.steps.push("  (a SIGUSR1 checkpoint asked for just before)");
      void collector.checkpoint({ stop: false }).catch(() => undefined);
    }
    // Now and then the collector is killed at one of the checkpoint's ops (SIGKILL mid-checkpoint).
    const crashOp = this.random() < 0.2 ? this.pick(["prepare", "commit", "publish", "resume"]) : undefined;
    const result = await this.unlessKilled(
      () =>
        collector.checkpoint({ stop }).catch((error: unknown) => {
          if (!(error instanceof CheckpointError)) this.violation(`checkpoint threw a non-catalog error: ${String(error)}`);
          return { published: false, checkpointId: "", error: (error as CheckpointError).code };
        }),
      crashOp,
    );
    this.steps.push(`  → ${JSON.stringify(result)}`);
    this.fault = undefined;
    if (result === "killed") {
      const openId = this.open?.id;
      await this.kill();
      // Killed before its publish went out: collection.json was written, or (a crash during its
      // durable replace) is not there, only a part of its temp file beside where it goes.
      if (this.lastCrash?.op === "publish" && !this.lastCrash.after && openId && this.random() < 0.5) await this.tearStateFile(openId);
      const gymToo = this.random() < 0.4;
      if (gymToo) this.restartGym();
      return this.startCollector(`restart after a crash mid-checkpoint${gymToo ? ", the Gym restarted" : ""}`);
    }
    if (!stop) return;
    // As the CLI does after its stop checkpoint: no reply taken any more, then the buffered records written.
    await collector.halt();
    await collector.flushRecords();
    await this.kill();
    const gymToo = this.random() < 0.5;
    if (gymToo) this.restartGym();
    await this.startCollector(`requeued after SIGTERM${gymToo ? ", the Gym restarted" : ""}`);
  }

  /** A crash during the durable replace of `id`'s collection.json: the file not in place, a part of its temp file left. */
  private async tearStateFile(id: string): Promise<void> {
    const path = join(this.root, id, "collection.json");
    const text = await readFile(path, "utf8").catch(() => "");
    if (!text) return;
    await rm(path);
    await this.leaveTempOf(path, text);
    this.steps.push(`  the crash came during the write of ${id}/collection.json: not in place, a part of its temp file left`);
  }

  /** What a crash mid-`replaceFileDurably(path, …)` leaves beside `path`: a part of its temp file (named as durable-fs names it). */
  private async leaveTempOf(path: string, text: string): Promise<void> {
    const temp = join(dirname(path), `.${basename(path)}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
    await writeFile(temp, text.slice(0, Math.floor(this.random() * text.length)));
  }

  /**
   * A crash of the dispatch loop between a row's dispatch-log append and its /run (docs/collect.md:
   * each attempt is on disk before its /run goes): a held /run is answered, its worker sends the
   * next row, and the collector dies once that row's attempt is logged, its /run never received
   * (see onRun). Then, now and then, the log ends in a torn line too (another worker's append under
   * way: a line the start must not take). False when no next row went out (a plain crash then).
   */
  private async crashAtNextDispatch(): Promise<boolean> {
    const held = this.parked() ? [] : this.answerable();
    if (!held.length) return false;
    const r = this.pick(held);
    let hit!: () => void;
    const dispatched = new Promise<void>((resolve) => (hit = resolve));
    this.dispatchCrash = { inc: this.inc, hit };
    const outcome = this.random() < 0.7 ? "success" : "http500";
    this.steps.push(`answer ${captureKey({ rollout_id: r.rollout, attempt: r.attempt })} of collector ${r.inc}: ${outcome}; the collector dies at the next /run it sends, logged, before it goes out`);
    this.reply(r, outcome);
    const timer = new Promise<void>((resolve) => setTimeout(resolve, 500));
    await Promise.race([dispatched, timer]);
    const landed = this.dispatchCrash === undefined;
    this.dispatchCrash = undefined;
    if (!landed) this.steps.push("  (no next /run went out: a plain crash)");
    return landed;
  }

  /** A torn last line of dispatched.jsonl: a line for `rollout_id` cut mid-append (maybe only its newline lost). */
  private async tearDispatchLog(): Promise<void> {
    const pending = this.rows.filter((id) => !this.inFile.has(id));
    if (!pending.length) return;
    const line = `${JSON.stringify({ rollout_id: this.pick(pending), attempt: Math.floor(this.random() * 4) })}\n`;
    const cut = 1 + Math.floor(this.random() * (line.length - 1));
    await appendFile(this.logPath, line.slice(0, cut));
    this.steps.push(`  dispatched.jsonl ends in a torn line: ${JSON.stringify(line.slice(0, cut))}`);
  }

  /** A crash mid-append: the last line of --out is cut somewhere (maybe only its newline lost). */
  private async tearLastLine(): Promise<void> {
    const text = await readFile(this.out, "utf8").catch(() => "");
    if (!text) return;
    const start = text.lastIndexOf("\n", text.length - 2) + 1;
    // Only a line the dying collector was appending.
    const last = JSON.parse(text.slice(start)) as { rollout_id: string; attempt: number };
    if (!this.reqs.some((r) => r.inc === this.inc && r.rollout === last.rollout_id && r.attempt === last.attempt && r.ended === "success")) return;
    // Its record published, its line was synced before: no append of it was under way.
    if ((await this.readRecords()).has(last.rollout_id)) return;
    const cut = start + 1 + Math.floor(this.random() * (text.length - start - 1));
    await truncate(this.out, Buffer.byteLength(text.slice(0, cut)));
    const torn = (JSON.parse(text.slice(start)) as { rollout_id: string }).rollout_id;
    if (cut < text.length - 1) this.inFile.delete(torn);
    this.steps.push(`  tore --out's last line (${torn}) at ${cut - start}/${text.length - start} bytes`);
  }

  /** The last step: no more faults; every /run succeeds; restarted until every row is in --out. */
  private async drain(): Promise<void> {
    this.steps.push("drain: every /run succeeds from now on");
    this.fault = undefined;
    this.retireFails = this.forgetFails = 0;
    this.retireDownUntil = 0;
    if (this.gymDown) await this.listen(this.port);
    this.gymDown = false;
    const until = Date.now() + 8_000;
    for (let restarts = 0; ; ) {
      if (!this.parked()) for (const r of this.held()) if (r.inc === this.inc && !this.dead.has(r.inc) && !r.closed && !r.retiredWhileWaited) this.reply(r, "success");
      if (this.ended) {
        await this.check();
        const done = await this.readOut();
        if (done.size === this.rows.length) break;
        if (++restarts > 8) this.violation(`the collection does not end: ${done.size}/${this.rows.length} rows in --out after ${restarts} restarts`);
        await this.kill();
        await this.startCollector("requeued: rows failed for good");
      }
      if (Date.now() > until) this.violation(`the collection does not end within 8 s (${JSON.stringify(this.snapshot?.())})`);
      if (this.runError) throw this.runError;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    await this.running;
    if (this.runError) throw this.runError;
    this.checkRecords(await this.readRecords(), await this.readOut(), true);
    const stats = this.collector!.summary().records;
    if (stats && (stats.unwritten || stats.failedFlushes)) this.violation(`rollout records: ${JSON.stringify(stats)}`);
    // Nothing of ours left open, and every rollout retired was forgotten after its last retire.
    if (this.open) this.violation(`the collection ended with checkpoint ${this.open.id} open (${this.open.phase})`);
    for (const [id, at] of this.lastRetired) {
      if ((this.lastForgot.get(id) ?? -1) < at && this.lastForgetFailed < at && !this.notForgotten.has(id)) this.violation(`rollout ${id} was retired and never forgotten after`);
    }
  }

  // ---- invariants -------------------------------------------------------------------------

  /** At a /run's arrival: attempts only grow; a restored row goes as attempt + 1; no send past --max-attempts. */
  private checkSend(r: Req): void {
    const key = captureKey({ rollout_id: r.rollout, attempt: r.attempt });
    if (!this.rows.includes(r.rollout)) this.violation(`/run of ${key}, a rollout --tasks does not name`);
    // Logged (on disk) before it is sent: a crash from here on leaves it named for the next start to retire.
    const logged = readFileSync(this.logPath, "utf8").split("\n").slice(1, -1).some((line) => {
      const e = JSON.parse(line) as { rollout_id?: string; attempt?: number; restored?: boolean };
      return e.rollout_id === r.rollout && e.attempt === r.attempt && !e.restored;
    });
    if (!logged) this.violation(`collector ${r.inc} sent ${key}, which dispatched.jsonl does not name as sent`);
    const earlier = this.reqs.filter((p) => p.rollout === r.rollout);
    const mine = earlier.filter((p) => p.inc === r.inc);
    const before = earlier.filter((p) => p.inc !== r.inc);
    const maxBefore = Math.max(-1, ...before.map((p) => p.attempt));
    if (mine.length === 0 && r.attempt <= maxBefore) this.violation(`collector ${r.inc} sent ${key}, but an earlier collector had sent attempt ${maxBefore}`);
    const last = mine[mine.length - 1];
    if (last && r.attempt < last.attempt) this.violation(`collector ${r.inc} sent ${key} after attempt ${last.attempt}`);
    if (last && r.attempt === last.attempt && last.ended !== "admission") this.violation(`collector ${r.inc} sent ${key} again after it ended ${last.ended}`);
    const expected = this.expectedFirst.get(`${r.inc}/${r.rollout}`);
    // Unless its first send may have failed unseen here (a connection the closing /run server reset), the first attempt received.
    const unseen = this.sawGymDown.has(r.inc) ? r.attempt < expected! : r.attempt !== expected;
    if (mine.length === 0 && expected !== undefined && unseen) this.violation(`collector ${r.inc} sent restored row ${r.rollout} as attempt ${r.attempt}, not ${expected}`);
    // After storage_error no row goes for pauses.storageS; this row's next send left only once its reply came.
    if (last?.ended === "storage" && performance.now() - last.answeredAt! < PAUSES.storageS * 1000) this.violation(`collector ${r.inc} sent ${key} within ${PAUSES.storageS} s of ${last.attempt}'s storage_error`);
    const failures = new Set(mine.filter((p) => COUNTED.has(p.ended ?? "")).map((p) => p.attempt)).size;
    if (failures >= this.maxAttempts) this.violation(`collector ${r.inc} sent ${key} after ${failures} failed attempts (--max-attempts ${this.maxAttempts})`);
    // Fenced by its own retire, the collector knows the attempt is gone; a clean-up or a predecessor's
    // retire it may not know of (docs/collect.md: such a send is refused stale_attempt and skipped).
    if ((this.fence.get(r.rollout) ?? -1) >= r.attempt && this.fencedBy.get(r.rollout) === r.inc) this.violation(`collector ${r.inc} sent ${key}, an attempt the Gym fenced (retired up to ${this.fence.get(r.rollout)})`);
  }

  /** A restore continues only rows LATEST's collection.json continues, none of them finished. */
  private checkRestoreScope(id: string, scope: EpisodeId[]): void {
    const continued = new Set((this.collections.get(id)?.continued ?? []).map(captureKey));
    for (const e of scope) {
      if (!continued.has(captureKey(e))) this.runError ??= new InvariantViolation(`step ${this.stepNo}: restore of ${id} continues ${captureKey(e)}, which its collection.json does not continue`);
      if (this.inFile.has(e.rollout_id)) this.runError ??= new InvariantViolation(`step ${this.stepNo}: restore continues ${captureKey(e)}, a row --out holds`);
    }
  }

  /** Every record line of the published record files in --records-dir (all steps, a follower's view): rollout → its records. */
  private async readRecords(): Promise<Map<string, { attempt: number; continued: boolean; step: string }[]>> {
    const found = new Map<string, { attempt: number; continued: boolean; step: string }[]>();
    if (!this.records) return found;
    const absent = <T>(value: T) => (error: NodeJS.ErrnoException) => {
      if (error.code === "ENOENT") return value;
      throw error;
    };
    const root = join(this.recordsDir, ROLLOUTS_DIR);
    for (const step of await readdir(root).catch(absent<string[]>([]))) {
      if (!/^step_[0-9]+$/.test(step)) continue;
      // Published whole (linked into place): every line is a record.
      const text = await readFile(join(root, step, rolloutRecordFileName("eval", "gym")), "utf8").catch(absent(""));
      for (const line of text.split("\n")) {
        if (!line) continue;
        const { info } = JSON.parse(line) as { info: { rollout_id: string; attempt: number; continued: boolean } };
        found.set(info.rollout_id, [...(found.get(info.rollout_id) ?? []), { attempt: info.attempt, continued: info.continued, step }]);
      }
    }
    return found;
  }

  /**
   * docs/collect.md, Rollout records: a record is published only once its row is in --out (synced
   * first), and a row is recorded once across restarts, as the attempt --out holds; `final` (the
   * collection ended): every row in --out has its record, but one a crash lost while buffered.
   * `recorded` is read before --out (`rows`): a row appended between the two reads has no record yet.
   */
  private checkRecords(recorded: Map<string, { attempt: number; continued: boolean; step: string }[]>, rows: Map<string, number>, final: boolean): void {
    if (!this.records) return;
    for (const [id, found] of recorded) {
      if (found.length > 1) this.violation(`the rollout records hold ${id} ${found.length} times (${found.map((r) => `attempt ${r.attempt} in ${r.step}`).join(", ")})`);
      const { attempt, continued, step } = found[0]!;
      const key = captureKey({ rollout_id: id, attempt });
      const abandoned = this.abandoned.find((a) => a.rows.includes(id));
      const inOut = abandoned ? abandoned.finished.get(id) : rows.get(id);
      if (inOut !== attempt) this.violation(`the rollout records hold ${key} (${step}), but ${inOut === undefined ? "--out does not hold the row" : `--out holds attempt ${inOut}`}`);
      if (continued !== this.restoredAttempts.has(`${id}@${attempt}`)) this.violation(`the record of ${key} says continued: ${continued}, but a restore ${continued ? "never installed" : "installed"} that attempt`);
    }
    if (!final) return;
    for (const finished of [rows, ...this.abandoned.map((a) => a.finished)]) {
      for (const id of finished.keys()) if (!recorded.has(id) && !this.mayLackRecord.has(id)) this.violation(`row ${id} is in --out, but no record of it was published (no crash lost it buffered)`);
    }
  }

  private async readOut(): Promise<Map<string, number>> {
    const text = await readFile(this.out, "utf8").catch((error: NodeJS.ErrnoException) => {
      if (error.code === "ENOENT") return "";
      throw error;
    });
    const rows = new Map<string, number>();
    if (text && !text.endsWith("\n")) this.violation(`--out ends with a torn line once the collector settled: ${JSON.stringify(text.slice(text.lastIndexOf("\n") + 1, text.lastIndexOf("\n") + 80))}`);
    for (const [i, line] of text.split("\n").slice(0, -1).entries()) {
      let parsed;
      try {
        parsed = ResultLineSchema.parse(JSON.parse(line));
      } catch (error) {
        this.violation(`--out line ${i + 1} is not a complete result line: ${String(error).slice(0, 200)}`);
      }
      if (rows.has(parsed.rollout_id)) this.violation(`--out holds ${parsed.rollout_id} twice (attempts ${rows.get(parsed.rollout_id)} and ${parsed.attempt})`);
      if (!this.rows.includes(parsed.rollout_id)) this.violation(`--out holds ${parsed.rollout_id}, which --tasks does not name`);
      const answered = this.reqs.some((r) => r.rollout === parsed.rollout_id && r.attempt === parsed.attempt && r.ended === "success");
      if (!answered) this.violation(`--out holds ${captureKey({ rollout_id: parsed.rollout_id, attempt: parsed.attempt })}, an attempt /run never answered with success`);
      if (parsed.continued !== this.restoredAttempts.has(`${parsed.rollout_id}@${parsed.attempt}`)) {
        this.violation(`--out says ${captureKey({ rollout_id: parsed.rollout_id, attempt: parsed.attempt })} continued: ${parsed.continued}, but a restore ${parsed.continued ? "never installed" : "installed"} that attempt`);
      }
      rows.set(parsed.rollout_id, parsed.attempt);
    }
    return rows;
  }

  /** After every step, once the live collector settled: --out whole and consistent, counts agreeing. */
  private async check(): Promise<void> {
    if (this.runError) throw this.runError;
    const until = Date.now() + SETTLE_MS;
    for (;;) {
      const problem = await this.unsettled();
      if (problem === undefined) break;
      if (Date.now() > until) this.violation(problem);
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    if (this.runError) throw this.runError;
  }

  /** Why the state does not (yet) satisfy the invariants, or undefined. */
  private async unsettled(): Promise<string | undefined> {
    const recorded = await this.readRecords();
    const text = await readFile(this.out, "utf8").catch(() => "");
    if (text && !text.endsWith("\n")) return "a torn last line in --out";
    const rows = await this.readOut();
    this.checkRecords(recorded, rows, false);
    // An abandoned collection's --out is left as it was (docs/collect.md, --new-collection).
    for (const a of this.abandoned) if ((await readFile(a.out, "utf8").catch(() => "")) !== a.text) this.violation(`the abandoned collection's ${a.out} changed`);
    const waited = this.reqs.find((r) => r.retiredWhileWaited && !r.closed && !this.dead.has(r.inc));
    if (waited) return `a retire fenced ${captureKey({ rollout_id: waited.rollout, attempt: waited.attempt })} while collector ${waited.inc} still waits for its /run`;
    for (const id of this.inFile) if (!rows.has(id)) this.violation(`row ${id} left --out`);
    this.inFile = new Set(rows.keys());
    // A success the live collector received is in --out (or it saw the reply fail, and sent the row again).
    for (const r of this.reqs) {
      if (!r.delivered || r.inc !== this.inc || this.dead.has(r.inc) || rows.get(r.rollout) === r.attempt) continue;
      const later = this.reqs.some((p) => p.inc === r.inc && p.rollout === r.rollout && p.attempt > r.attempt);
      if (!later && !this.collector!.summary().failedRows.some((f) => f.rollout_id === r.rollout)) return `collector ${r.inc} got the success of ${captureKey({ rollout_id: r.rollout, attempt: r.attempt })}, but --out does not hold it`;
    }
    const snap = this.snapshot?.();
    if (!snap) return undefined;
    const summary = this.collector!.summary();
    if (snap.done !== rows.size) return `progress counts ${snap.done} done, --out holds ${rows.size} rows`;
    if (summary.finished !== snap.done || summary.failed !== snap.failed) return `the summary (${summary.finished} finished, ${summary.failed} failed) and the progress line (${snap.done}, ${snap.failed}) disagree`;
    if (snap.doneBefore !== this.rowsAtStart) return `progress counts ${snap.doneBefore} rows done before this run, --out held ${this.rowsAtStart} at its start`;
    if (snap.total !== this.rows.length || snap.done + snap.failed + snap.inFlight > snap.total) return `progress counts do not add up: ${JSON.stringify(snap)}`;
    // No checkpoint of ours stays open once it ended (a stop checkpoint's process is gone; the next start closes it).
    if (this.open && this.open.phase !== "restored" && !this.fault) return `checkpoint ${this.open.id} stays open (${this.open.phase})`;
    return undefined;
  }
}

function jsonOrUndefined(text: string): unknown {
  try {
    return JSON.parse(text) as unknown;
  } catch {
    return undefined;
  }
}

function keys(episodes: EpisodeId[]): string {
  return episodes.map(captureKey).join(",") || "(none)";
}
