import { existsSync, mkdirSync, readFileSync, readdirSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import {
  CONTROL_MESSAGES,
  CheckpointError,
  ErrorCodeSchema,
  MANIFEST_FILE,
  captureKey,
  decodeRequest,
  nextAttempt,
  sha256Hex,
  type EpisodeId,
  type PhaseOp,
} from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { deferred } from "../deferred.js";
import { FaultyStorage } from "./faulty-storage.js";
import { ModelKind } from "./model-kind.js";
import { GRACE_S, ReferenceModel, commitArgs, restoreArgs, type Prediction, type Surroundings } from "./reference-model.js";
import { InvariantViolation } from "../seeded-model-run.js";

/**
 * One participant (a ScriptableKind environment on a ManualClock, storage in a temp directory) and
 * the reference model of what docs/protocol.md says it must do, driven by random control messages
 * from a seeded PRNG. Every step is logged (`steps`), so a failure names the sequence that led to it.
 */

const T0_MS = 1_700_000_000_000;
const ROLLOUTS = ["r0", "r1", "r2", "r3"];
const INSTANCE = "env0";
/** A real op never takes this long here (no real timers, a tmpfs): one still pending hangs. */
const HANG_MS = 3_000;


type Outcome = { ok: true; reply: unknown } | { ok: false; error: CheckpointError; raw: unknown };

export class ModelWorld {
  readonly steps: string[] = [];
  readonly model = new ReferenceModel();
  readonly clock = new ManualClock(T0_MS);
  readonly storage = new FaultyStorage();
  kind = new ModelKind();
  plane!: ParticipantControlPlane;
  private incarnation = "inc-0";
  private restarts = 0;
  private cursor = 0;
  private readonly sent: { op: PhaseOp; raw: string }[] = [];
  /** Checkpoint ids resumed with no manifest of theirs on disk: none may appear later (docs: "once it returns, no manifest of that checkpoint can appear"). */
  private readonly stoppedWrites = new Set<string>();
  /** Whether snapshots list the checkpoint files: for the ops that write (commit), the ones whose refusal could leave a file. */
  private filesWatched = false;

  private constructor(
    readonly root: string,
    private readonly random: () => number,
  ) {
    this.startProcess();
  }

  static async create(random: () => number): Promise<ModelWorld> {
    // tmpfs when there is one: a commit fsyncs several times.
    const base = existsSync("/dev/shm") ? "/dev/shm" : tmpdir();
    return new ModelWorld(await mkdtemp(join(base, "gym-ckpt-model-")), random);
  }

  async close(): Promise<void> {
    this.plane.dispose();
    await rm(this.root, { recursive: true, force: true });
  }

  private startProcess(): void {
    this.incarnation = `inc-${this.restarts}`;
    this.plane = new ParticipantControlPlane({
      adapter: this.kind,
      instance: INSTANCE,
      incarnation: this.incarnation,
      clock: this.clock,
      storage: this.storage,
      leaseGraceSeconds: GRACE_S,
      checkpointRoot: this.root,
      readinessPollMs: 1e9, // a waiting prepare wakes on notifications and at its deadline only
      epochFloor: this.model.highest,
    });
  }

  // ---- random choices --------------------------------------------------------------------

  private chance(p: number): boolean {
    return this.random() < p;
  }

  private pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.random() * items.length)]!;
  }

  private get nowS(): number {
    return this.clock.now() / 1000;
  }

  private epoch(): number {
    const current = Math.max(1, this.model.highest);
    const r = this.random();
    if (r < 0.8) return current;
    if (r < 0.9) return Math.max(0, current - 1);
    return current + 1;
  }

  private deadline(): number {
    const r = this.random();
    if (r < 0.86) return this.inTime();
    if (r < 0.96) return this.nowS - 1;
    return this.nowS + 8 * 24 * 3600;
  }

  /** A deadline ahead, 20-60 s: each later one extends the lease further. */
  private inTime(): number {
    return this.nowS + 20 + Math.floor(this.random() * 41);
  }

  private checkpointId(): string {
    const r = this.random();
    if (r < 0.15) this.cursor++;
    if (r < 0.75 || this.cursor === 0) return `c${this.cursor}`;
    if (r < 0.9) return `c${Math.floor(this.random() * this.cursor)}`;
    return this.model.activeId ?? `c${this.cursor}`;
  }

  private episode(): EpisodeId {
    const live = [...this.kind.episodes.values(), ...this.kind.restored.values()].map((r) => r.episode_id);
    if (live.length && this.chance(0.7)) return this.pick(live);
    return { rollout_id: this.pick(ROLLOUTS), attempt: Math.floor(this.random() * 4) };
  }

  private scope(): EpisodeId[] {
    const n = 1 + Math.floor(this.random() * 3);
    return Array.from({ length: n }, () => this.episode());
  }

  private dirOf(id: string): string {
    return join(this.root, id);
  }

  // ---- steps -----------------------------------------------------------------------------

  async step(): Promise<void> {
    const r = this.random();
    if (r < 0.05) return this.restart();
    if (r < 0.15) return this.advanceClock();
    if (r < 0.27) return this.dataPlane();
    if (r < 0.32) return this.status();
    if (r < 0.42 && this.sent.length) return this.retry();
    if (r < 0.45) return this.queuedBehindSlowRetire();
    return this.message();
  }

  private async restart(): Promise<void> {
    this.log("restart: a fresh process (no live state), epoch floor from the lease");
    this.plane.dispose();
    this.restarts++;
    this.kind = new ModelKind();
    this.model.restart();
    this.stoppedWrites.clear();
    this.startProcess();
    this.checkState("restart");
  }

  private async advanceClock(): Promise<void> {
    const lease = this.model.lease;
    const ms = lease !== null && this.chance(0.5) ? Math.max(0, lease * 1000 - this.clock.now()) + 1000 : this.pick([1000, 5000, 45_000]);
    this.log(`advance clock ${ms} ms`);
    this.clock.advance(ms);
    this.model.advanceTo(this.clock.now());
    // A lease expiry reopens under the lock, a few promise turns after its timer fired.
    for (let i = 0; i < 50 && this.plane.currentPhase !== this.model.phase; i++) await turn();
    this.checkState("advance clock");
  }

  private async dataPlane(): Promise<void> {
    const r = this.random();
    if (r < 0.35) {
      // A new rollout starts (admission open only while idle), never at an attempt fenced here.
      if (!this.kind.admissionOpen) return this.log("data plane: admission closed, nothing starts");
      const rollout = this.pick(ROLLOUTS);
      const held = [...this.kind.episodes.values(), ...this.kind.restored.values()].some((e) => e.episode_id.rollout_id === rollout);
      if (held) return this.log(`data plane: ${rollout} already runs`);
      let attempt = 0;
      while (this.plane.isRetired({ rollout_id: rollout, attempt })) attempt++;
      this.kind.addEpisode({ rollout_id: rollout, attempt }, { step: Math.floor(this.random() * 100) });
      this.log(`data plane: ${captureKey({ rollout_id: rollout, attempt })} starts`);
    } else if (r < 0.5) {
      const pending = [...this.kind.restored.values()];
      if (!this.kind.admissionOpen || !pending.length) return this.log("data plane: no replacement to start");
      const next = this.pick(pending).episode_id;
      this.kind.claim(next);
      this.log(`data plane: replacement ${captureKey(next)} starts`);
    } else if (r < 0.6) {
      const live = [...this.kind.episodes.keys()];
      if (!this.kind.admissionOpen || !live.length) return this.log("data plane: nothing to finish");
      const done = this.pick(live);
      this.kind.episodes.delete(done);
      this.log(`data plane: ${done} finishes`);
    } else if (r < 0.8) {
      const blockers = this.chance(0.5) ? ["call-in-flight"] : [];
      this.kind.setBlockers(blockers);
      this.log(`data plane: blockers ${JSON.stringify(blockers)}`);
    } else {
      const live = [...this.kind.episodes.keys()];
      const restarts = live.length && this.chance(0.5) ? [this.pick(live)] : [];
      this.kind.setRestarts(restarts);
      this.log(`data plane: restarts ${JSON.stringify(restarts)}`);
    }
  }

  private async status(): Promise<void> {
    const epoch = this.chance(0.5) ? this.epoch() : undefined;
    this.log(`status ${epoch === undefined ? "{}" : `{epoch: ${epoch}}`}`);
    const reply = await this.plane.handle("status", epoch === undefined ? {} : { epoch });
    this.validReply("status", reply);
    if (epoch !== undefined) this.model.highest = Math.max(this.model.highest, epoch);
    this.checkState("status");
  }

  /** The same body again, as a coordinator retrying after a timeout sends it. */
  private async retry(): Promise<void> {
    const { op, raw } = this.pick(this.sent.slice(-6));
    await this.deliver(op, raw, "retry");
  }

  private async message(): Promise<void> {
    // Mostly what a coordinator would send next, so sequences get far; otherwise anything.
    const planned = this.chance(0.6);
    const op = planned ? this.plannedOp() : this.pick<PhaseOp>(["prepare", "prepare", "commit", "commit", "resume", "resume", "restore", "retire", "forget", "renew"]);
    const body = this.body(op);
    if (planned) Object.assign(body, this.plannedFields(op));
    if (this.chance(0.04)) return this.deliver(op, this.malformed(body), "malformed");
    await this.deliver(op, JSON.stringify(body), "send");
  }

  /** The op a coordinator driving this participant would send next. */
  private plannedOp(): PhaseOp {
    switch (this.model.phase) {
      case "idle":
        if (!this.kind.hasLiveState() && this.committedIds().length && this.chance(0.6)) return "restore";
        return this.pick<PhaseOp>(["prepare", "prepare", "prepare", "retire", "forget"]);
      case "preparing":
        return this.pick<PhaseOp>(["prepare", "resume", "renew"]);
      case "prepared":
        return this.pick<PhaseOp>(["commit", "commit", "commit", "renew", "resume"]);
      case "committed":
        return this.pick<PhaseOp>(["resume", "resume", "renew", "commit"]);
      case "restored":
        return this.pick<PhaseOp>(["retire", "forget", "renew", "resume", "resume"]);
    }
  }

  /** A planned message names the checkpoint in hand (a new one once that was resumed) at the leader's epoch, in time. */
  private plannedFields(op: PhaseOp): Record<string, unknown> {
    if (op === "restore") return { epoch: Math.max(1, this.model.highest), deadline_ts: this.inTime() };
    while (this.model.resumed.includes(`c${this.cursor}`)) this.cursor++;
    const id = this.model.activeId ?? (op === "retire" || op === "forget" ? op : `c${this.cursor}`);
    const fields: Record<string, unknown> = { checkpoint_id: id, epoch: Math.max(1, this.model.highest), deadline_ts: this.inTime() };
    if (op === "commit") {
      const dir = this.dirOf(id);
      if (this.chance(0.97)) mkdirSync(dir, { recursive: true });
      fields["checkpoint_dir"] = dir;
    }
    return fields;
  }

  private body(op: PhaseOp): Record<string, unknown> {
    const common = { checkpoint_id: this.checkpointId(), deadline_ts: this.deadline(), epoch: this.epoch() };
    const guarded = (): Record<string, unknown> => {
      const r = this.random();
      return r < 0.8 ? {} : r < 0.95 ? { incarnation: this.incarnation } : { incarnation: "inc-other" };
    };
    switch (op) {
      case "prepare":
      case "renew":
      case "resume":
        return { ...common, ...guarded() };
      case "commit": {
        const dir = this.chance(0.03) ? "/elsewhere/outside-root" : this.dirOf(common.checkpoint_id);
        // The coordinator makes the checkpoint directory before any commit; not always seen here.
        if (dir.startsWith(this.root) && this.chance(0.93)) mkdirSync(dir, { recursive: true });
        return { ...common, ...guarded(), checkpoint_dir: dir, episode_ids: this.chance(0.5) ? null : this.scope(), stop: this.chance(0.1) };
      }
      case "restore": {
        const committed = this.committedIds();
        const id = committed.length && this.chance(0.75) ? this.pick(committed) : common.checkpoint_id;
        const dir = this.chance(0.03) ? "/elsewhere/outside-root" : this.dirOf(id);
        const records = this.recordsIn(dir);
        const scope = records?.length && this.chance(0.7) ? records.filter(() => this.chance(0.7)) : this.scope();
        // One attempt per rollout (two is invalid_request, the malformed case).
        const perRollout = new Map(scope.map((e) => [e.rollout_id, e]));
        const pinned = this.manifestSha(dir);
        const r = this.random();
        const pin = r < 0.5 ? {} : r < 0.9 && pinned ? { manifest_sha256: pinned } : { manifest_sha256: "0".repeat(64) };
        return { ...common, checkpoint_id: id, checkpoint_dir: dir, episode_ids: [...perRollout.values()], ...pin };
      }
      case "retire":
      case "forget": {
        const id = this.model.phase === "restored" && this.chance(0.8) ? this.model.activeId! : this.chance(0.7) ? op : common.checkpoint_id;
        const extra = op === "retire" ? { episode_ids: this.scope() } : { rollout_ids: this.scope().map((e) => e.rollout_id) };
        return { ...common, checkpoint_id: id, ...extra };
      }
    }
  }

  private malformed(body: Record<string, unknown>): string {
    const r = this.random();
    if (r < 0.2) return JSON.stringify({ ...body, bogus: 1 });
    if (r < 0.35) {
      const { epoch: _dropped, ...rest } = body;
      return JSON.stringify(rest);
    }
    if (r < 0.5) return JSON.stringify({ ...body, epoch: -1 });
    if (r < 0.6) return JSON.stringify({ ...body, deadline_ts: String(body["deadline_ts"]) });
    if (r < 0.7) return JSON.stringify({ ...body, checkpoint_id: "../escape" });
    if (r < 0.8) return `{"epoch":${body["epoch"]},${JSON.stringify(body).slice(1)}`; // a key named twice
    if (r < 0.9) return JSON.stringify({ ...body, episode_ids: [{ rollout_id: "r0", attempt: 0 }, { rollout_id: "r0", attempt: 1 }] });
    return JSON.stringify(body).slice(0, -1); // truncated JSON
  }

  // ---- one message -----------------------------------------------------------------------

  private surroundings(op: PhaseOp, request: any): Surroundings {
    const dir = request.checkpoint_dir as string | undefined;
    return {
      nowMs: this.clock.now(),
      live: this.kind.hasLiveState(),
      blocked: this.kind.readiness().blockers.length > 0,
      restarts: this.kind.readiness().restarts,
      closeFails: this.kind.failClose,
      installFails: this.kind.failInstall,
      openFails: this.kind.failOpen,
      writeFails: false,
      incarnation: this.incarnation,
      ...(dir !== undefined && {
        dir: {
          inside: dir.startsWith(`${this.root}/`),
          visible: existsSync(dir),
          manifestSha256: this.manifestSha(dir),
          ...(op === "restore" && { records: this.recordsIn(dir) }),
        },
      }),
    };
  }

  private async deliver(op: PhaseOp, raw: string, how: string): Promise<void> {
    let request: any;
    try {
      request = decodeRequest(CONTROL_MESSAGES[op].request, raw);
    } catch (error) {
      this.log(`${how} ${op} ${raw} -> ${(error as CheckpointError).code} (decoder)`);
      if (!(error instanceof CheckpointError) || error.code !== "invalid_request") this.fail(`the decoder answered ${String(error)}, not invalid_request`);
      return;
    }
    this.sent.push({ op, raw });
    // Scripted kind-side failures, armed for this message only.
    const fault = this.random();
    if (fault < 0.05) this.kind.failClose = true;
    else if (fault < 0.1 && op === "restore") this.kind.failInstall = true;
    else if (fault < 0.1 && op === "resume") this.kind.failOpen = true;
    const env = this.surroundings(op, request);
    if (fault >= 0.1 && fault < 0.15 && op === "commit") {
      env.writeFails = true;
      this.storage.failNextWrite();
    }
    const faults = [env.closeFails && "closeAdmission fails", env.installFails && "install fails", env.openFails && "openAdmission fails", env.writeFails && "write fails"].filter(Boolean);
    this.log(`${how} ${op} ${raw}${faults.length ? ` [${faults.join(", ")}]` : ""}`);
    const prediction = this.model.predict(op, request, env);
    this.filesWatched = op === "commit";
    const before = this.snapshot();
    const epochBefore = this.model.highest;

    if (prediction.kind === "waits") await this.waitingPrepare(request, raw);
    else if (prediction.kind === "fresh" && op === "commit" && this.chance(0.2)) await this.heldCommit(request, raw);
    else {
      const expectedExport = op === "commit" ? this.expectedExport(request) : undefined;
      const outcome = await this.send(op, request);
      this.judge(op, request, prediction, outcome, before, epochBefore, expectedExport);
    }
    // Whatever was armed and not used is taken back: the next message scripts its own.
    this.kind.failClose = false;
    this.kind.failInstall = false;
    this.kind.failOpen = false;
    this.storage.clearFaults();
    this.checkState(`${op} ${how}`);
  }

  private async send(op: PhaseOp, request: unknown): Promise<Outcome> {
    const answer = this.plane.handle(op, request as never).then(
      (reply): Outcome => ({ ok: true, reply }),
      (raw: unknown): Outcome => ({ ok: false, error: raw instanceof CheckpointError ? raw : new CheckpointError("internal_error", String(raw)), raw }),
    );
    let timer: NodeJS.Timeout | undefined;
    const hung = new Promise<"hung">((resolve) => (timer = setTimeout(() => resolve("hung"), HANG_MS)));
    const outcome = await Promise.race([answer, hung]);
    clearTimeout(timer);
    if (outcome === "hung") this.fail(`${op} never answered`);
    const settled = outcome as Outcome;
    this.log(`  -> ${settled.ok ? JSON.stringify(brief(settled.reply)) : `${settled.error.code}: ${settled.error.message.slice(0, 160)}`}`);
    return settled;
  }

  /** Checks one answer against the prediction and applies it to the model. */
  private judge(op: PhaseOp, request: any, prediction: Prediction, outcome: Outcome, before: Snapshot, epochBefore: number, expectedExport?: string[]): void {
    if (prediction.kind === "republish") {
      if (outcome.ok) prediction = { kind: "fresh" };
      else prediction = { kind: "refusal", code: "checkpoint_conflict", admitted: true };
    }
    if (!outcome.ok) {
      const code = outcome.error.code;
      if (!ErrorCodeSchema.safeParse(code).success) this.fail(`refusal code ${code} is not in the catalog`);
      if (!(outcome.raw instanceof CheckpointError) && !String(outcome.raw).includes("scripted")) this.fail(`a non-catalog error escaped: ${String(outcome.raw)}`);
      if (prediction.kind !== "refusal") this.fail(`expected ${prediction.kind === "kept" ? "the kept reply" : "success"}, got ${code}: ${outcome.error.message}`);
      if (prediction.code !== code) this.fail(`expected refusal ${prediction.code}, got ${code}: ${outcome.error.message}`);
      if (prediction.admitted) this.model.admitted(request.epoch);
      // A failed prepare (its closeAdmission threw) reopens everything, as if it never came.
      if (op === "prepare" && code === "internal_error") this.model.reopen(undefined);
      // A resume whose openAdmission threw: the id is fenced and its write stopped, the phase stays (docs: Reopen).
      if (op === "resume" && code === "internal_error") this.model.stopWrite(request.checkpoint_id);
      // A failed write exported first: the export is this checkpoint's, whatever retries name (docs: export once).
      if (op === "commit" && (code === "storage_error" || code === "checkpoint_conflict") && this.storage.lastWriteRecords !== undefined) this.model.pendingWrite = { id: request.checkpoint_id, args: commitArgs(request) };
      this.storage.lastWriteRecords = undefined;
      const after = this.snapshot();
      if (!isDeepStrictEqual(before, after)) this.fail(`refusal ${code} changed state:\n before ${JSON.stringify(before)}\n after  ${JSON.stringify(after)}`);
      const expectedEpoch = prediction.admitted ? Math.max(epochBefore, request.epoch) : epochBefore;
      if (this.plane.status().epoch !== expectedEpoch) this.fail(`epoch fence ${this.plane.status().epoch}, expected ${expectedEpoch} (admitted: ${prediction.admitted})`);
      return;
    }
    this.storage.lastWriteRecords = undefined;
    this.validReply(op, outcome.reply);
    if (prediction.kind === "refusal") this.fail(`expected refusal ${prediction.code}, got ${JSON.stringify(brief(outcome.reply))}`);
    this.model.admitted(request.epoch);
    if (prediction.kind === "kept") {
      if (!isDeepStrictEqual(outcome.reply, prediction.reply)) this.fail(`a retry got another reply than the kept one:\n kept ${JSON.stringify(prediction.reply)}\n got  ${JSON.stringify(outcome.reply)}`);
      // Every prepare renews the lease, one answered from its kept reply too (kept only while its id is active).
      if (op === "prepare") this.model.renewLease(request.deadline_ts);
      return;
    }
    this.applySuccess(op, request, outcome.reply as any, expectedExport);
  }

  private applySuccess(op: PhaseOp, request: any, reply: any, expectedExport: string[] | undefined): void {
    const m = this.model;
    const id = request.checkpoint_id as string;
    switch (op) {
      case "prepare":
        if (reply.phase !== "prepared") this.fail(`prepare without blockers answered ${reply.phase}`);
        m.activeId = id;
        m.phase = "prepared";
        m.renewLease(request.deadline_ts);
        m.remember(id, "prepare", reply);
        return;
      case "commit": {
        this.checkCommitOnDisk(request, reply);
        if (expectedExport && !isDeepStrictEqual(reply.episode_ids, expectedExport)) this.fail(`commit exported ${JSON.stringify(reply.episode_ids)}, expected ${JSON.stringify(expectedExport)}`);
        m.phase = "committed";
        m.renewLease(request.deadline_ts);
        m.pendingWrite = { id, args: commitArgs(request) };
        m.remember(id, "commit", reply, commitArgs(request));
        return;
      }
      case "restore": {
        const scope = new Set(request.episode_ids.map(captureKey));
        const records = this.recordsIn(request.checkpoint_dir)!.filter((e) => scope.has(captureKey(e)));
        const expected = [...new Set(records.map((e) => captureKey(nextAttempt(e))))].sort();
        if (!isDeepStrictEqual(reply.restored, expected)) this.fail(`restore installed ${JSON.stringify(reply.restored)}, expected attempt+1 of its scope ${JSON.stringify(expected)}`);
        for (const key of expected) if (!this.kind.restored.has(key)) this.fail(`restored ${key} is not held by the kind`);
        for (const episode of request.episode_ids) m.mark(m.restoredFrom, episode);
        m.phase = "restored";
        m.activeId = id;
        m.resumedCommits.delete(id);
        m.renewLease(request.deadline_ts);
        m.remember(id, "restore", reply, restoreArgs(request), this.manifestSha(request.checkpoint_dir));
        return;
      }
      case "resume": {
        const reopens = m.activeId === id;
        if (!isDeepStrictEqual(reply, { phase: "idle", idempotent: !reopens })) this.fail(`resume answered ${JSON.stringify(reply)}`);
        if (reopens) {
          if (this.manifestSha(this.dirOf(id)) === undefined) this.stoppedWrites.add(id);
          m.reopen(id);
        } else if (!m.resumed.includes(id)) m.fence(id);
        return;
      }
      case "renew":
        m.renewLease(request.deadline_ts);
        if (reply.lease_expires_at !== m.lease) this.fail(`renew answered lease ${reply.lease_expires_at}, expected ${m.lease}`);
        return;
      case "retire": {
        for (const episode of request.episode_ids as EpisodeId[]) m.mark(m.retired, episode);
        if (m.phase === "restored") m.renewLease(request.deadline_ts);
        const expected = [...new Set((request.episode_ids as EpisodeId[]).map(captureKey))].sort();
        if (!isDeepStrictEqual(reply.retired, expected)) this.fail(`retire answered ${JSON.stringify(reply.retired)}`);
        for (const e of request.episode_ids as EpisodeId[]) {
          const held = [...this.kind.episodes.values(), ...this.kind.restored.values()].find((r) => r.episode_id.rollout_id === e.rollout_id && r.episode_id.attempt <= e.attempt);
          if (held) this.fail(`retired ${captureKey(e)} but the kind still holds ${captureKey(held.episode_id)}`);
        }
        return;
      }
      case "forget": {
        const rollouts = [...new Set(request.rollout_ids as string[])].sort();
        if (m.phase === "restored") m.renewLease(request.deadline_ts);
        for (const rollout of rollouts) {
          m.retired.delete(rollout);
          m.restoredFrom.delete(rollout);
        }
        if (!isDeepStrictEqual(reply.forgotten, rollouts)) this.fail(`forget answered ${JSON.stringify(reply.forgotten)}`);
        return;
      }
    }
  }

  /** A prepare that waits for blockers; how the wait ends is drawn: they clear, the deadline comes, a resume comes, or a retry joins it. */
  private async waitingPrepare(request: any, raw: string): Promise<void> {
    const m = this.model;
    const id = request.checkpoint_id as string;
    const seen = this.kind.blockedChecks;
    const first = this.send("prepare", request);
    await this.untilWaiting(seen, "prepare");
    m.admitted(request.epoch);
    if (m.phase === "idle") m.activeId = id;
    m.phase = "preparing";
    m.renewLease(request.deadline_ts);
    const how = this.random();
    if (how < 0.3) {
      this.log("  blockers clear");
      this.kind.setBlockers([]);
      const outcome = await first;
      this.judge("prepare", request, { kind: "fresh" }, outcome, this.snapshot(), m.highest);
    } else if (how < 0.55) {
      this.log("  the deadline comes");
      this.clock.advance(request.deadline_ts * 1000 - this.clock.now());
      const outcome = await first;
      if (!outcome.ok || (outcome.reply as any).phase !== "preparing") this.fail(`a prepare whose blockers stayed answered ${JSON.stringify(outcome)}`);
      this.validReply("prepare", (outcome as any).reply);
      m.advanceTo(this.clock.now());
      if (this.kind.admissionOpen) this.fail("a prepare left preparing reopened admission");
    } else if (how < 0.8) {
      const epoch = m.highest;
      this.log(`  resume {checkpoint_id: ${id}, epoch: ${epoch}} while it waits`);
      const resumed = await this.send("resume", { checkpoint_id: id, deadline_ts: this.nowS + 30, epoch });
      if (!resumed.ok || !isDeepStrictEqual(resumed.reply, { phase: "idle", idempotent: false })) this.fail(`resume of a waiting prepare answered ${JSON.stringify(resumed)}`);
      const outcome = await first;
      if (!outcome.ok || (outcome.reply as any).phase !== "idle") this.fail(`a prepare resumed while it waited answered ${JSON.stringify(outcome)}`);
      this.validReply("prepare", (outcome as any).reply);
      m.reopen(id);
    } else {
      this.log("  the same prepare again, then blockers clear");
      const seenAgain = this.kind.blockedChecks;
      const second = this.send("prepare", decodeRequest(CONTROL_MESSAGES.prepare.request, raw));
      await this.untilWaiting(seenAgain, "retried prepare");
      this.kind.setBlockers([]);
      const [a, b] = [await first, await second];
      if (!a.ok || !b.ok || (a.reply as any).phase !== "prepared" || !isDeepStrictEqual(a.reply, b.reply)) this.fail(`a prepare and its retry answered ${JSON.stringify(a)} and ${JSON.stringify(b)}`);
      this.validReply("prepare", (a as any).reply);
      m.phase = "prepared";
      m.renewLease(request.deadline_ts);
      m.remember(id, "prepare", (a as any).reply);
    }
  }

  private async untilWaiting(seen: number, what: string): Promise<void> {
    for (let i = 0; i < 200 && this.kind.blockedChecks === seen; i++) await turn();
    if (this.kind.blockedChecks === seen) this.fail(`${what} never started waiting for its blockers`);
    await turn(); // its timer and waiter are set in the same turn as the check
  }

  /** A commit whose write is slow: a resume stops it, a retry joins it, or its deadline passes while it writes. */
  private async heldCommit(request: any, raw: string): Promise<void> {
    const m = this.model;
    const id = request.checkpoint_id as string;
    const args = commitArgs(request);
    const expectedExport = this.expectedExport(request);
    const held = this.storage.holdNextWrite();
    const first = this.send("commit", request);
    await Promise.race([held.started, first]);
    await turn(); // the commit reaches its deadline race (the write may start before it)
    m.admitted(request.epoch);
    const leaseBefore = m.lease;
    m.renewLease(request.deadline_ts);
    m.pendingWrite = { id, args };
    const how = this.random();
    if (how < 0.35) {
      this.log(`  resume {checkpoint_id: ${id}} while it writes`);
      const resumed = await this.send("resume", { checkpoint_id: id, deadline_ts: this.nowS + 30, epoch: m.highest });
      if (!resumed.ok || !isDeepStrictEqual(resumed.reply, { phase: "idle", idempotent: false })) this.fail(`resume of a writing commit answered ${JSON.stringify(resumed)}`);
      held.release();
      const outcome = await first;
      await this.storage.lastWrite;
      if (outcome.ok || outcome.error.code !== "stale_checkpoint") this.fail(`a commit resumed while it wrote answered ${JSON.stringify(outcome.ok ? outcome.reply : outcome.error.code)}`);
      if (this.manifestSha(request.checkpoint_dir) === undefined) this.stoppedWrites.add(id);
      m.reopen(id);
    } else if (how < 0.7) {
      this.log("  the same commit again while it writes");
      const second = this.send("commit", decodeRequest(CONTROL_MESSAGES.commit.request, raw));
      held.release();
      const [a, b] = [await first, await second];
      if (!a.ok || !b.ok || !isDeepStrictEqual(a.reply, b.reply)) this.fail(`a commit and its retry answered ${JSON.stringify(brief(a))} and ${JSON.stringify(brief(b))}`);
      this.validReply("commit", a.reply);
      this.applySuccess("commit", request, a.reply, expectedExport);
    } else if (how < 0.8) {
      this.log("  its deadline passes while it writes, then the write ends");
      this.clock.advance(request.deadline_ts * 1000 - this.clock.now());
      const outcome = await first;
      if (outcome.ok || outcome.error.code !== "deadline_exceeded") this.fail(`a commit past its deadline answered ${JSON.stringify(outcome.ok ? outcome.reply : outcome.error.code)}`);
      held.release();
      await this.storage.lastWrite;
      m.advanceTo(this.clock.now());
      m.pendingWrite = { id, args, written: true };
    } else if (how < 0.9) {
      const renewal = { checkpoint_id: id, deadline_ts: this.nowS + 45, epoch: m.highest };
      this.log(`  renew ${JSON.stringify(renewal)} while it writes, then the write fails`);
      const renewed = await this.send("renew", renewal);
      m.renewLease(renewal.deadline_ts);
      if (!renewed.ok || (renewed.reply as any).lease_expires_at !== m.lease) this.fail(`renew during a write answered ${JSON.stringify(renewed)}, expected lease ${m.lease}`);
      this.storage.failHeldWrite = true;
      held.release();
      const outcome = await first;
      if (outcome.ok || outcome.error.code !== "storage_error") this.fail(`a commit whose write failed answered ${JSON.stringify(outcome.ok ? brief(outcome.reply) : outcome.error.code)}`);
      // docs (Lease): a failed commit extends nothing; the renew's extension stands.
      m.lease = Math.max(leaseBefore ?? 0, renewal.deadline_ts + GRACE_S);
    } else {
      this.log("  the lease runs out while it writes");
      this.clock.advance(m.lease! * 1000 - this.clock.now());
      for (let i = 0; i < 50 && this.plane.currentPhase !== "idle"; i++) await turn();
      held.release();
      const outcome = await first;
      await this.storage.lastWrite;
      if (outcome.ok) this.fail(`a commit whose lease ran out while it wrote answered ${JSON.stringify(brief(outcome.reply))}`);
      if (this.manifestSha(request.checkpoint_dir) === undefined) this.stoppedWrites.add(id);
      m.advanceTo(this.clock.now());
    }
    this.storage.lastWriteRecords = undefined;
  }

  /**
   * docs (Epoch fence): checked on arrival and again under the lock. A prepare at epoch e that
   * passed the arrival check while a slow retire held the lock, queued behind a newer leader's
   * forget (e+1), is refused stale_epoch once its turn comes, and changes nothing.
   */
  private async queuedBehindSlowRetire(): Promise<void> {
    const m = this.model;
    if (m.phase !== "idle") return this.log("queued behind a slow retire: not idle, skipped");
    const epoch = Math.max(1, m.highest);
    const retire = { checkpoint_id: "retire", deadline_ts: this.inTime(), epoch, episode_ids: [this.episode()] };
    const forget = { checkpoint_id: "forget", deadline_ts: this.inTime(), epoch: epoch + 1, rollout_ids: [this.pick(ROLLOUTS)] };
    const prepare = { checkpoint_id: `c${this.cursor}`, deadline_ts: this.inTime(), epoch };
    this.log(`queued behind a slow retire ${JSON.stringify(retire)}: forget ${JSON.stringify(forget)}, then prepare ${JSON.stringify(prepare)}`);
    const gate = deferred();
    this.kind.delay("retire", gate.promise);
    const retires = () => this.kind.hooks().filter((h) => h === "retire").length;
    const before = retires();
    const a = this.send("retire", retire);
    for (let i = 0; i < 200 && retires() === before; i++) await turn();
    if (retires() === before) this.fail("the slow retire never reached its kind");
    const b = this.send("forget", forget);
    const c = this.send("prepare", prepare);
    await turn();
    gate.resolve();
    const [ra, rb, rc] = [await a, await b, await c];
    if (!ra.ok || !rb.ok) this.fail(`retire and forget answered ${JSON.stringify(ra)} and ${JSON.stringify(rb)}`);
    m.admitted(epoch);
    this.applySuccess("retire", retire, ra.reply as any, undefined);
    m.admitted(epoch + 1);
    this.applySuccess("forget", forget, rb.reply as any, undefined);
    if (rc.ok || rc.error.code !== "stale_epoch") this.fail(`a prepare of a deposed epoch queued behind a newer one answered ${JSON.stringify(rc.ok ? brief(rc.reply) : rc.error.code)}`);
    this.checkState("queued behind a slow retire");
  }

  /** What a fresh export must hold: the kind's episodes and pending restores in scope, none fenced. Unknown once an earlier export stands. */
  private expectedExport(request: any): string[] | undefined {
    if (this.model.pendingWrite?.id === request.checkpoint_id) return undefined;
    const scope = request.episode_ids === null ? undefined : new Set((request.episode_ids as EpisodeId[]).map(captureKey));
    const held = [...this.kind.episodes.values(), ...this.kind.restored.values()].map((r) => r.episode_id);
    return [...new Set(held.filter((e) => !this.plane.isRetired(e) && (!scope || scope.has(captureKey(e)))).map(captureKey))].sort();
  }

  // ---- invariants --------------------------------------------------------------------------

  private validReply(op: keyof typeof CONTROL_MESSAGES, reply: unknown): void {
    const parsed = CONTROL_MESSAGES[op].reply.safeParse(reply);
    if (!parsed.success) this.fail(`${op} reply does not match its schema: ${parsed.error.message}`);
  }

  /** What a refusal must leave as it was. */
  private snapshot(): Snapshot {
    const status = this.plane.status();
    const grid = ROLLOUTS.flatMap((rollout_id) => [0, 1, 2, 3, 4].map((attempt) => this.plane.isRetired({ rollout_id, attempt })));
    return {
      phase: status.phase,
      checkpoint_id: status.checkpoint_id,
      lease: status.lease_expires_at,
      retired_rollouts: status.retired_rollouts,
      admission: this.kind.admissionOpen,
      episodes: [...this.kind.episodes.keys()].sort(),
      restored: [...this.kind.restored.keys()].sort(),
      fenced: grid.map((f) => (f ? 1 : 0)).join(""),
      files: this.filesWatched ? checkpointFiles(this.root) : [],
    };
  }

  /** After every step: the participant is where the model says, admission open exactly when idle, and storage consistent. */
  private checkState(after: string): void {
    const status = this.plane.status();
    const m = this.model;
    const want = { phase: m.phase, checkpoint_id: m.activeId, lease_expires_at: m.lease, epoch: m.highest, retired_rollouts: m.retired.size };
    const got = { phase: status.phase, checkpoint_id: status.checkpoint_id, lease_expires_at: status.lease_expires_at, epoch: status.epoch, retired_rollouts: status.retired_rollouts };
    if (!isDeepStrictEqual(want, got)) this.fail(`after ${after}: state ${JSON.stringify(got)}, the model says ${JSON.stringify(want)}`);
    // Running again after resume or lease expiry; closed while a checkpoint or restore holds it.
    if (this.kind.admissionOpen !== (status.phase === "idle")) this.fail(`after ${after}: admission ${this.kind.admissionOpen ? "open" : "closed"} in phase ${status.phase}`);
    for (const [rollout, attempt] of m.restoredFrom) if (!this.plane.isRetired({ rollout_id: rollout, attempt })) this.fail(`restored source ${rollout}@${attempt} is not fenced`);
    // Only commits write (a late one too, within its step): the rest would only re-read the same files.
    if (/commit/.test(after)) this.checkStorage();
    for (const id of this.stoppedWrites) if (this.manifestSha(this.dirOf(id)) !== undefined) this.fail(`a manifest of ${id} appeared after its resume returned`);
  }

  /** Records before manifest: every manifest names a records file on disk with its digest and count. */
  private checkStorage(): void {
    for (const file of checkpointFiles(this.root)) {
      if (!file.endsWith(`/${MANIFEST_FILE}`)) continue;
      const dir = join(this.root, file.slice(0, -MANIFEST_FILE.length));
      const manifest = JSON.parse(readFileSync(join(this.root, file), "utf8"));
      const recordsPath = join(dir, manifest.records_file);
      if (!existsSync(recordsPath)) this.fail(`${file} names ${manifest.records_file}, which is not on disk`);
      const bytes = readFileSync(recordsPath);
      if (sha256Hex(bytes) !== manifest.records_sha256) this.fail(`${manifest.records_file} does not match its manifest's digest`);
      const lines = bytes.toString("utf8").split("\n").filter(Boolean).length;
      if (lines !== manifest.record_count) this.fail(`${manifest.records_file} holds ${lines} records, its manifest says ${manifest.record_count}`);
    }
  }

  private checkCommitOnDisk(request: any, reply: any): void {
    const path = join(request.checkpoint_dir, reply.manifest_path);
    if (!existsSync(path)) this.fail(`a commit answered ok without ${path}`);
    const bytes = readFileSync(path);
    if (sha256Hex(bytes) !== reply.manifest_sha256) this.fail("the committed manifest's digest differs from the reply's manifest_sha256");
    if (!isDeepStrictEqual(JSON.parse(bytes.toString("utf8")), reply.manifest)) this.fail("the committed manifest differs from the reply's");
    const keys = this.recordsIn(request.checkpoint_dir)!.map(captureKey).sort();
    if (!isDeepStrictEqual([...new Set(keys)].sort(), reply.episode_ids)) this.fail(`the committed records hold ${JSON.stringify(keys)}, the reply says ${JSON.stringify(reply.episode_ids)}`);
    for (const key of reply.episode_ids) {
      const [rollout_id, attempt] = key.includes("-a") ? [key.split("-a")[0]!, Number(key.split("-a")[1])] : [key, 0];
      if (this.plane.isRetired({ rollout_id, attempt })) this.fail(`commit exported ${key}, which is fenced`);
    }
    if (request.episode_ids !== null) {
      const scope = new Set((request.episode_ids as EpisodeId[]).map(captureKey));
      for (const key of reply.episode_ids) if (!scope.has(key)) this.fail(`commit exported ${key}, outside its scope`);
    }
  }

  // ---- disk --------------------------------------------------------------------------------

  private participantDir(dir: string): string {
    return join(dir, "gym", "environment", INSTANCE);
  }

  private manifestSha(dir: string): string | undefined {
    const path = join(this.participantDir(dir), MANIFEST_FILE);
    return existsSync(path) ? sha256Hex(readFileSync(path)) : undefined;
  }

  private recordsIn(dir: string): EpisodeId[] | undefined {
    const path = join(this.participantDir(dir), MANIFEST_FILE);
    if (!existsSync(path)) return undefined;
    const manifest = JSON.parse(readFileSync(path, "utf8"));
    return readFileSync(join(this.participantDir(dir), manifest.records_file), "utf8")
      .split("\n")
      .filter(Boolean)
      .map((line) => JSON.parse(line).episode_id as EpisodeId);
  }

  private committedIds(): string[] {
    if (!existsSync(this.root)) return [];
    return readdirSync(this.root).filter((id) => this.manifestSha(this.dirOf(id)) !== undefined);
  }

  // ---- reporting ---------------------------------------------------------------------------

  private log(line: string): void {
    this.steps.push(line);
  }

  private fail(message: string): never {
    throw new InvariantViolation(message);
  }
}

interface Snapshot {
  phase: string;
  checkpoint_id: string | null;
  lease: number | null;
  retired_rollouts: number;
  admission: boolean;
  episodes: string[];
  restored: string[];
  fenced: string;
  files: string[];
}

/** Manifests and records files under the root (temp files and directories left out), relative and sorted. */
function checkpointFiles(root: string): string[] {
  if (!existsSync(root)) return [];
  const files = readdirSync(root, { recursive: true, withFileTypes: true })
    .filter((entry) => entry.isFile() && (entry.name === MANIFEST_FILE || /^records-[0-9a-f]{64}\.jsonl$/.test(entry.name)))
    .map((entry) => join(entry.parentPath, entry.name).slice(root.length + 1));
  return files.sort();
}

/** A reply short enough for a step log. */
function brief(reply: unknown): unknown {
  if (reply && typeof reply === "object" && "report" in reply) return { ...(reply as object), report: "…" };
  if (reply && typeof reply === "object" && "manifest" in reply) return { phase: "committed", episode_ids: (reply as unknown as { episode_ids: unknown }).episode_ids };
  return reply;
}

/** One turn of the event loop: promise chains and timers' callbacks started meanwhile run. */
const turn = () => new Promise((resolve) => setImmediate(resolve));
