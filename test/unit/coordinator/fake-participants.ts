import { randomUUID } from "node:crypto";
import { statSync } from "node:fs";
import { mkdir, writeFile } from "node:fs/promises";
import { basename, join } from "node:path";
import { waitUntil } from "../../support/wait-until.js";
import { pino, type Logger } from "pino";
import {
  GUARDED_OPS,
  MANIFEST_SCHEMA_VERSION,
  MAX_DEADLINE_AHEAD_S,
  captureKey,
  nextAttempt,
  sha256Hex,
  type EpisodeId,
  type Kind,
  type Op,
  type ParticipantEntry,
} from "../../../protocol/index.js";
import { CheckpointEngine, type EngineHooks } from "../../../coordinator/engine/checkpoint-engine.js";
import type { Clock } from "../../../coordinator/engine/clock.js";
import { ParticipantClient, type ParticipantRef } from "../../../coordinator/engine/participant-client.js";
import type { MembershipSource } from "../../../coordinator/membership/member-registry.js";
import { NoRespondersFailure, RequestTimeoutFailure, type ParticipantTransport, type TransportRequestOptions } from "../../../coordinator/engine/transport.js";
import { MemoryDecisionJournal, type JournalEntry } from "../../../coordinator/ha/decision-journal.js";
import { ParticipantMemory } from "./participant-memory.js";
import { StaticLeadership } from "../../../coordinator/ha/leadership.js";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";

export interface Call {
  seq: number;
  kind: Kind;
  instance: string;
  op: Op;
  body: Record<string, unknown>;
  timeoutMs: number;
  /** How it ended: `ok`, the participant's refusal code, or the transport's `unreachable` / `timeout` (`late`: done, its reply lost). */
  answered?: string;
  /** When it was answered, on the `seq` counter (a later request's seq is higher): the order of stages. */
  answeredSeq?: number;
}

/**
 * `timeout`: the request never reached the participant (nothing done), its try timed out; `late`: the
 * participant did it, but its reply came after the try's timeout (a stalled process, a lost reply);
 * `hang`: no reply until the caller's cancellation. With memory (deadlines checked as a real
 * participant does): `delayed`, the request reaches the participant only at its deadline (a stalled
 * network; the shared clock moves there); `slow`, the kind's hook runs past the deadline (the clock
 * moves to it) and the participant answers as its control plane does then (see answerSlow).
 */
type Behaviour = "ok" | "unreachable" | "timeout" | "late" | "hang" | "delayed" | "slow" | { epoch: number } | { error: string } | { notReady: string[] } | { restarts: string[] } | { scopeRequired: true };

/** In-memory participants behind a fake transport; every request is recorded in order. */
export class FakeParticipants implements ParticipantTransport {
  readonly calls: Call[] = [];
  readonly events: string[] = [];
  private seq = 0;
  /** Advanced by a scripted timeout, as if the request had waited that long. */
  clock: TestClock | undefined;
  /** behaviour per `${kind}.${instance}.${op}` (default ok). */
  readonly script = new Map<string, Behaviour>();
  /** What each participant's `status` reports, following the phase messages it answered. */
  readonly state = new Map<string, { phase: string; checkpoint_id: string | null }>();
  /** The incarnation a participant's restore reply names, per `${kind}.${instance}` (default: none). */
  readonly restorers = new Map<string, string>();
  /** The episode_ids a participant's commit reply lists, per `${kind}.${instance}` (default: none). */
  readonly exported = new Map<string, string[]>();
  /**
   * What each participant restored, per `${kind}.${instance}.${checkpoint_id}`, until its resume:
   * like a real participant's reply cache, a restore with the same directory and scope (whatever its
   * epoch and deadline) gets the same reply, and one with others `checkpoint_conflict`.
   */
  readonly restoredHere = new Map<string, { args: string; reply: string }>();
  /** The restores that installed (not answered from that cache), as `kind/instance`. */
  readonly installs: string[] = [];
  /** Per commit received, whether its checkpoint_dir was a directory when it arrived (the coordinator makes it first). */
  readonly commitSawDir: boolean[] = [];
  /**
   * Each participant's process incarnation, per `${kind}.${instance}`, once a test sets it (restart):
   * a guarded message (prepare, renew, commit, resume) addressed to another is refused
   * `stale_incarnation` before anything is done, and a restore's reply names it. Unset: not checked.
   */
  readonly incarnation = new Map<string, string>();
  /** Guarded messages refused as another incarnation's while the refusing process held their checkpoint (it took part: misaddressed). */
  readonly misaddressed: { participant: string; addressed: string; detail: string }[] = [];
  private restarts = 0;
  /**
   * Opt-in (tests written before it script these refusals themselves): each process remembers
   * what a real one does (ParticipantMemory): its resumed fence, kept commit replies and live state.
   */
  memory = false;
  private readonly memories = new Map<string, ParticipantMemory>();
  /** `${kind}.${instance}.${checkpoint_id}` of every commit that wrote its files (not one answered from a kept reply). */
  readonly committed = new Set<string>();

  /** Requests held until released, per `${kind}.${instance}.${op}` (see hold). */
  private readonly held = new Map<string, { released: Promise<void>; arrived: () => void }>();

  constructor(readonly members: { kind: Kind; instance: string }[]) {}

  /**
   * Holds every `op` request to this participant (recorded, then unanswered) until the returned
   * function is called; then each is answered as scripted. A controllable reply, no sleeps.
   * `reached` resolves once the first such request arrived.
   */
  hold(kind: Kind, instance: string, op: Op): { reached: Promise<void>; release: () => void } {
    let release!: () => void;
    let arrived!: () => void;
    const reached = new Promise<void>((resolve) => (arrived = resolve));
    const key = `${kind}.${instance}.${op}`;
    this.held.set(key, { released: new Promise<void>((resolve) => (release = resolve)), arrived });
    return {
      reached,
      release: () => {
        this.held.delete(key);
        release();
      },
    };
  }

  set(kind: Kind, instance: string, op: Op, behaviour: Behaviour): void {
    this.script.set(`${kind}.${instance}.${op}`, behaviour);
  }

  ops(op: Op): Call[] {
    return this.calls.filter((c) => c.op === op);
  }

  /**
   * The participant's process restarted: a new incarnation (returned), holding nothing (idle, no
   * checkpoint, its reply cache gone). Its membership announcement is the test's to make.
   */
  restart(kind: Kind, instance: string): string {
    const who = `${kind}.${instance}`;
    const incarnation = `${kind}-${instance}-${++this.restarts}`;
    this.incarnation.set(who, incarnation);
    this.state.delete(who);
    this.memories.delete(who);
    for (const key of [...this.restoredHere.keys()]) if (key.startsWith(`${who}.`)) this.restoredHere.delete(key);
    return incarnation;
  }

  /** The process `${kind}.${instance}` now (see memory). */
  memoryOf(who: string): ParticipantMemory {
    let memory = this.memories.get(who);
    if (!memory) this.memories.set(who, (memory = new ParticipantMemory()));
    return memory;
  }

  /** Its lease expired: it resumed by itself, exactly as a resume would (control-plane onLeaseTimer), fencing the id it held. */
  leaseExpired(kind: Kind, instance: string): void {
    const who = `${kind}.${instance}`;
    const held = this.state.get(who)?.checkpoint_id;
    this.state.set(who, { phase: "idle", checkpoint_id: null });
    if (!this.memory || !held) return;
    this.memoryOf(who).reopen(held);
    this.restoredHere.delete(`${who}.${held}`);
  }

  async request(subject: string, body: string, options: TransportRequestOptions): Promise<string> {
    const pending = this.requestOnce(subject, body, options);
    const call = this.calls[this.calls.length - 1]!; // recorded before requestOnce's first await
    try {
      const reply = await pending;
      call.answeredSeq = this.seq++;
      call.answered = (JSON.parse(reply) as { error?: { code: string } }).error?.code ?? "ok";
      return reply;
    } catch (error) {
      call.answeredSeq = this.seq++;
      call.answered = error instanceof NoRespondersFailure ? "unreachable" : error instanceof RequestTimeoutFailure ? "timeout" : "thrown";
      throw error;
    }
  }

  private async requestOnce(subject: string, body: string, options: TransportRequestOptions): Promise<string> {
    const parts = subject.split(".");
    const [kind, instance, op] = [parts[5] as Kind, parts[6]!, parts[7] as Op];
    const parsed = JSON.parse(body) as Record<string, unknown>;
    this.calls.push({ seq: this.seq++, kind, instance, op, body: parsed, timeoutMs: options.timeoutMs });
    this.events.push(`${op}:${kind}/${instance}`);
    await Promise.resolve();
    const held = this.held.get(`${kind}.${instance}.${op}`);
    if (held) {
      held.arrived();
      await held.released;
    }
    const behaviour = this.script.get(`${kind}.${instance}.${op}`) ?? "ok";
    if (behaviour === "unreachable") throw new NoRespondersFailure(subject);
    // A participant too stalled to answer: the request stays in flight until the caller's bound or abort ends the wait.
    if (behaviour === "hang") return new Promise<string>((_resolve, reject) => options.cancellation?.onCancel(reject));
    // The try's whole timeout passes (from when it was sent: requests sent together wait together).
    const timedOut = () => {
      if (this.clock) this.clock.current = Math.max(this.clock.current, (options.sentAtMs ?? this.clock.current) + options.timeoutMs);
      return new RequestTimeoutFailure(subject, options.timeoutMs);
    };
    if (behaviour === "timeout") throw timedOut();
    const arrivalMs = options.sentAtMs ?? this.clock?.current ?? Date.now();
    if (behaviour === "late") {
      // Done there (its state changed), but the reply arrives only after the try gave up on it.
      await this.answer(kind, instance, op, parsed, "ok", arrivalMs);
      throw timedOut();
    }
    if (behaviour === "delayed") {
      // It arrives at its deadline: the participant's clock (the shared one) is there too.
      const deadlineMs = typeof parsed.deadline_ts === "number" ? parsed.deadline_ts * 1000 : arrivalMs;
      if (this.clock) this.clock.current = Math.max(this.clock.current, deadlineMs);
      return this.answer(kind, instance, op, parsed, "ok", Math.max(arrivalMs, deadlineMs));
    }
    return this.answer(kind, instance, op, parsed, behaviour, arrivalMs);
  }

  private restoredAlready(kind: Kind, instance: string, op: Op, parsed: Record<string, unknown>): boolean {
    if (op !== "restore") return false;
    const args = JSON.stringify([parsed.checkpoint_dir, (parsed.episode_ids as EpisodeId[]).map(captureKey).sort()]);
    return this.restoredHere.get(`${kind}.${instance}.${String(parsed.checkpoint_id)}`)?.args === args;
  }

  /**
   * With memory, a real participant's answers before its phase change (control-plane cached, admit
   * and restore's freshness check), for the ops they concern; undefined: go on. Prepare's conflict
   * and phase checks and resume's conflict are answer's own.
   */
  private admitRemembering(memory: ParticipantMemory, who: string, op: Op, parsed: Record<string, unknown>, commitArgs: string): string | undefined {
    const refuse = (code: string, detail: string) => JSON.stringify({ error: { code, detail } });
    const id = String(parsed.checkpoint_id);
    if (op === "commit") {
      const cached = memory.cachedCommit(id, commitArgs);
      if (cached && "conflict" in cached) return refuse("checkpoint_conflict", cached.conflict);
      if (cached) return cached.reply;
    }
    const allowed: Partial<Record<Op, string[]>> = { prepare: ["idle", "preparing"], commit: ["prepared"], restore: ["idle"], renew: ["preparing", "prepared", "committed", "restored"] };
    const phases = allowed[op];
    if (!phases) return undefined;
    if (memory.fenced(id)) return refuse("stale_checkpoint", `checkpoint ${id} was already resumed`);
    // A prepare's reply is cached once ready (answered before admission while it is held): answer's checks model that.
    if (op === "prepare") return undefined;
    const held = this.state.get(who) ?? { phase: "idle", checkpoint_id: null };
    if (held.checkpoint_id !== null && held.checkpoint_id !== id) return refuse("checkpoint_conflict", `checkpoint ${held.checkpoint_id} is active; ${op} for ${id} refused`);
    if (!phases.includes(held.phase)) return refuse("invalid_phase", `${op} is not allowed in phase ${held.phase}`);
    if (op === "restore" && memory.live) return refuse("invalid_checkpoint_state", "restore needs a fresh process: this participant holds live state");
    return undefined;
  }

  /**
   * control-plane checkDeadline on arrival (`arrivalMs`, the participant's clock then): past →
   * `deadline_exceeded`, more than MAX_DEADLINE_AHEAD_S ahead → `invalid_request`. A restore past
   * its deadline that would be refused in time answers that refusal instead (lateRestoreRefusal):
   * still `deadline_exceeded` while its id is active here.
   */
  private refusedForDeadline(memory: ParticipantMemory, who: string, op: Op, parsed: Record<string, unknown>, arrivalMs: number): string | undefined {
    const refuse = (code: string, detail: string) => JSON.stringify({ error: { code, detail } });
    const deadlineMs = (parsed.deadline_ts as number) * 1000;
    if (deadlineMs > arrivalMs + MAX_DEADLINE_AHEAD_S * 1000) return refuse("invalid_request", "deadline_ts lies too far ahead");
    if (deadlineMs > arrivalMs) return undefined;
    const late = refuse("deadline_exceeded", "deadline_ts has already passed");
    if (op !== "restore") return late;
    const id = String(parsed.checkpoint_id);
    const held = this.state.get(who) ?? { phase: "idle", checkpoint_id: null };
    if (held.checkpoint_id === id) return late;
    if (memory.fenced(id)) return refuse("stale_checkpoint", `checkpoint ${id} was already resumed`);
    if (held.checkpoint_id !== null) return refuse("checkpoint_conflict", `checkpoint ${held.checkpoint_id} is active; restore for ${id} refused`);
    if (held.phase !== "idle") return refuse("invalid_phase", `restore is not allowed in phase ${held.phase}`);
    if (memory.live) return refuse("invalid_checkpoint_state", "restore needs a fresh process: this participant holds live state");
    return late;
  }

  /** control-plane admitOutsideCheckpoint: retire and forget only while idle or restored, and then naming the restored id. */
  private admitOutsideCheckpoint(who: string, op: Op, parsed: Record<string, unknown>): string | undefined {
    const held = this.state.get(who) ?? { phase: "idle", checkpoint_id: null };
    if (held.phase !== "idle" && held.phase !== "restored") {
      return JSON.stringify({ error: { code: "invalid_phase", detail: `${op} is refused while checkpoint ${held.checkpoint_id} is open (${held.phase}); resume first` } });
    }
    if (held.phase === "restored" && held.checkpoint_id !== parsed.checkpoint_id) {
      return JSON.stringify({ error: { code: "checkpoint_conflict", detail: `checkpoint ${held.checkpoint_id} is restored here; ${op} must name it` } });
    }
    return undefined;
  }

  /**
   * An admitted op whose kind hook outlives its deadline (the shared clock moves there), answered as
   * the control plane does: prepare (waitReady) `preparing`, admission closed, with a blocker;
   * commit (raceDeadline over the write) `deadline_exceeded`, still prepared, the files written, no
   * reply kept; restore (abandonLateInstall) `deadline_exceeded`, idle, attempt+1 of its scope
   * retired here (the late install ended and was freed at once); retire `deadline_exceeded`, its
   * marks staying; forget `deadline_exceeded`, lifting none. Renew has no hook: answered in time.
   */
  private async answerSlow(memory: ParticipantMemory, kind: Kind, instance: string, op: Op, parsed: Record<string, unknown>, report: (blockers: string[]) => unknown): Promise<string> {
    const who = `${kind}.${instance}`;
    const id = String(parsed.checkpoint_id);
    const toDeadline = () => {
      if (this.clock && typeof parsed.deadline_ts === "number") this.clock.current = Math.max(this.clock.current, parsed.deadline_ts * 1000);
    };
    const late = (why: string) => JSON.stringify({ error: { code: "deadline_exceeded", detail: `${op} did not finish before its deadline (${why})` } });
    switch (op) {
      case "prepare": {
        const held = this.state.get(who);
        // Admission as answer's (another checkpoint held, or past preparing): answered there.
        if ((held?.checkpoint_id && held.checkpoint_id !== id) || held?.phase === "prepared" || held?.phase === "committed" || held?.phase === "restored") break;
        this.state.set(who, { phase: "preparing", checkpoint_id: id });
        toDeadline();
        return JSON.stringify({ phase: "preparing", report: report(["slow"]) });
      }
      case "commit":
        await writeParticipantFiles(parsed.checkpoint_dir as string, kind, instance, []);
        toDeadline();
        return late("the write");
      case "restore":
        this.installs.push(`${kind}/${instance}`);
        memory.retire((parsed.episode_ids as EpisodeId[]).map(nextAttempt));
        toDeadline();
        return late("the install");
      case "retire":
        memory.retire(parsed.episode_ids as EpisodeId[]);
        toDeadline();
        return late("the kind's retire");
      case "forget":
        toDeadline();
        return late("the kind's forget");
      default:
        break;
    }
    return this.answer(kind, instance, op, parsed, "ok", this.clock?.current ?? Date.now());
  }

  /** What the participant answers (and does) for a request that reached it. */
  private async answer(
    kind: Kind,
    instance: string,
    op: Op,
    parsed: Record<string, unknown>,
    behaviour: Exclude<Behaviour, "unreachable" | "timeout" | "late" | "hang" | "delayed">,
    arrivalMs: number,
  ): Promise<string> {
    const who = `${kind}.${instance}`;
    const current = this.incarnation.get(who);
    const addressed = parsed.incarnation as string | undefined;
    // A real participant's first check (control-plane checkIncarnation), before its epoch and phase.
    if (current !== undefined && addressed !== undefined && addressed !== current && (GUARDED_OPS as readonly string[]).includes(op)) {
      if (this.state.get(who)?.checkpoint_id === parsed.checkpoint_id) {
        this.misaddressed.push({ participant: who, addressed, detail: `${op}:${kind}/${instance} of ${String(parsed.checkpoint_id)} addressed to ${addressed}, held by ${current}` });
      }
      return JSON.stringify({ error: { code: "stale_incarnation", detail: `addressed to ${addressed}; this process is ${current}` } });
    }
    const memory = this.memory ? this.memoryOf(who) : undefined;
    // Next, every op but resume (and status) checks its deadline (control-plane checkDeadline), before its reply cache.
    if (memory && op !== "resume" && op !== "status" && typeof parsed.deadline_ts === "number") {
      const refused = this.refusedForDeadline(memory, who, op, parsed, arrivalMs);
      if (refused !== undefined) return refused;
    }
    // A restore this participant restored is answered from its reply cache before anything else (a real one's first check), whatever it is scripted to refuse.
    if (typeof behaviour === "object" && "error" in behaviour && !this.restoredAlready(kind, instance, op, parsed)) {
      return JSON.stringify({ error: { code: behaviour.error, detail: "scripted" } });
    }
    const restarts = typeof behaviour === "object" && "restarts" in behaviour ? behaviour.restarts : [];
    const scopeRequired = typeof behaviour === "object" && "scopeRequired" in behaviour ? { scope_required: true } : {};
    const report = (blockers: string[]) => ({ ready: blockers.length === 0, blockers, blocker_count: blockers.length, counts: {}, restarts, ...scopeRequired });
    const track = (phase: string) => this.state.set(`${kind}.${instance}`, { phase, checkpoint_id: phase === "idle" ? null : (parsed.checkpoint_id as string) });
    const restoredKey = `${kind}.${instance}.${String(parsed.checkpoint_id)}`;
    const restoreArgs = op === "restore" ? JSON.stringify([parsed.checkpoint_dir, (parsed.episode_ids as EpisodeId[]).map(captureKey).sort()]) : "";
    if (op === "restore") {
      const cached = this.restoredHere.get(restoredKey);
      if (cached && cached.args !== restoreArgs) return JSON.stringify({ error: { code: "checkpoint_conflict", detail: "another directory or scope" } });
      if (cached) return cached.reply;
    }
    const commitArgs = op === "commit" ? JSON.stringify([parsed.checkpoint_dir, parsed.episode_ids === null ? "*" : [...new Set((parsed.episode_ids as EpisodeId[]).map(captureKey))].sort(), parsed.stop]) : "";
    if (memory) {
      const answered = this.admitRemembering(memory, who, op, parsed, commitArgs);
      if (answered !== undefined) return answered;
      if (op === "retire" || op === "forget") {
        const refused = this.admitOutsideCheckpoint(who, op, parsed);
        if (refused !== undefined) return refused;
      }
      // The fake's checkpoints hold a record of every episode in scope: the kinds refuse one whose
      // next attempt is fenced here before installing anything (docs/protocol.md, Restore).
      const fenced = op === "restore" ? (parsed.episode_ids as EpisodeId[]).map(nextAttempt).filter((e) => memory.fencedAttempt(e)) : [];
      if (fenced.length > 0) return JSON.stringify({ error: { code: "stale_attempt", detail: `${fenced.map(captureKey).join(", ")} was retired` } });
      if (behaviour === "slow") return this.answerSlow(memory, kind, instance, op, parsed, report);
    }
    if (op === "restore") {
      this.installs.push(`${kind}/${instance}`);
      memory?.restored(String(parsed.checkpoint_id));
      // control-plane restore, once installed: its source attempts continue only as their next.
      memory?.continuedAsNext(parsed.episode_ids as EpisodeId[]);
    }
    // control-plane retire: the marks first (then the kind's work); forget lifts both marks once its kind's forget succeeded.
    if (op === "retire") memory?.retire(parsed.episode_ids as EpisodeId[]);
    if (op === "forget") memory?.forget(parsed.rollout_ids as string[]);
    if (op === "prepare") {
      // As a real participant's admission (control-plane admit): another checkpoint held here is a
      // conflict, nothing changed; its own, past prepared, answers the prepare it was prepared with.
      const held = this.state.get(who);
      if (held?.checkpoint_id && held.checkpoint_id !== parsed.checkpoint_id) {
        return JSON.stringify({ error: { code: "checkpoint_conflict", detail: `checkpoint ${held.checkpoint_id} is active; prepare for ${String(parsed.checkpoint_id)} refused` } });
      }
      if (held?.phase === "restored") return JSON.stringify({ error: { code: "invalid_phase", detail: "prepare is not allowed in phase restored" } });
      if (held?.phase === "committed") return JSON.stringify({ phase: "prepared", report: report([]) });
    }
    if (op === "resume") {
      // As a real participant's resume: of its own checkpoint, or idempotent while idle; not of another one it holds.
      const held = this.state.get(who);
      if (held?.checkpoint_id && held.checkpoint_id !== parsed.checkpoint_id) {
        return JSON.stringify({ error: { code: "checkpoint_conflict", detail: `checkpoint ${held.checkpoint_id} is active, not ${String(parsed.checkpoint_id)}` } });
      }
    }
    if (op === "resume") this.restoredHere.delete(restoredKey);
    // Fenced here, as a real resume does (of its own checkpoint, or of any id while idle).
    const idempotent = op === "resume" && this.state.get(who)?.checkpoint_id !== parsed.checkpoint_id;
    if (op === "resume") memory?.reopen(String(parsed.checkpoint_id));
    if (op === "prepare") track(typeof behaviour === "object" && "notReady" in behaviour ? "preparing" : "prepared");
    if (op === "commit") track("committed");
    if (op === "resume") track("idle");
    if (op === "restore") track("restored");
    switch (op) {
      case "prepare":
        if (typeof behaviour === "object" && "notReady" in behaviour) return JSON.stringify({ phase: "preparing", report: report(behaviour.notReady) });
        return JSON.stringify({ phase: "prepared", report: report([]) });
      case "commit": {
        this.commitSawDir.push(isDirectory(parsed.checkpoint_dir as string));
        // Written as a participant writes them (no records): a restore reads the manifest back.
        const entry = await writeParticipantFiles(parsed.checkpoint_dir as string, kind, instance, []);
        this.committed.add(`${who}.${String(parsed.checkpoint_id)}`);
        const reply = JSON.stringify({
          phase: "committed",
          manifest: entry.manifest,
          manifest_path: entry.manifest_path,
          manifest_sha256: entry.manifest_sha256,
          episode_ids: this.exported.get(`${kind}.${instance}`) ?? [],
          extras: {},
        });
        memory?.committed(String(parsed.checkpoint_id), commitArgs, reply);
        return reply;
      }
      case "resume":
        return JSON.stringify({ phase: "idle", idempotent: memory !== undefined && idempotent });
      case "restore": {
        const reply = JSON.stringify({
          phase: "restored",
          source_checkpoint_id: parsed.checkpoint_id,
          restored: (parsed.episode_ids as { rollout_id: string; attempt: number }[]).map((e) => captureKey(nextAttempt(e))),
          ...((this.restorers.has(who) || current !== undefined) && { incarnation: this.restorers.get(who) ?? current }),
        });
        this.restoredHere.set(restoredKey, { args: restoreArgs, reply });
        return reply;
      }
      case "retire": {
        // With memory as control-plane retire answers (unique, sorted); tests before it pin the keys as sent.
        const keys = (parsed.episode_ids as EpisodeId[]).map(captureKey);
        return JSON.stringify({ retired: memory ? [...new Set(keys)].sort() : keys });
      }
      case "forget":
        return JSON.stringify({ forgotten: memory ? [...new Set(parsed.rollout_ids as string[])].sort() : parsed.rollout_ids });
      case "renew":
        return JSON.stringify({ lease_expires_at: 1 });
      case "status":
        return JSON.stringify({
          kind,
          instance,
          ...(this.state.get(`${kind}.${instance}`) ?? { phase: "idle", checkpoint_id: null }),
          lease_expires_at: null,
          epoch: typeof behaviour === "object" && "epoch" in behaviour ? behaviour.epoch : 0,
          retired_rollouts: 0,
          report: report(typeof behaviour === "object" && "notReady" in behaviour ? behaviour.notReady : []),
          protocol_version: 1,
          extras: {},
        });
    }
  }
}

export class TestClock implements Clock {
  constructor(public current = 1_800_000_000_000) {}
  /** Pins a retry's jitter: 1, its top (the whole grown wait), unless a test sets another. */
  random: () => number = () => 1;
  now(): number {
    return this.current;
  }
  monotonic(): number {
    return this.current;
  }
  /** Never fires: time moves only as the tests move it. */
  setTimer(_fn: () => void, _ms: number): () => void {
    return () => undefined;
  }
  async sleep(ms: number): Promise<void> {
    this.current += ms;
  }
}

export const FOUR_KINDS: { kind: Kind; instance: string }[] = [
  { kind: "agent", instance: "a2" },
  { kind: "environment", instance: "e1" },
  { kind: "resources", instance: "r1" },
  { kind: "agent", instance: "a1" },
  { kind: "model", instance: "m1" },
];

/** Writers of the engines made so far: a test's teardown awaits their background file work. */
export const writers: GlobalManifestWriter[] = [];

export function makeEngine(
  root: string,
  options: {
    members?: { kind: Kind; instance: string }[];
    hooks?: EngineHooks;
    attemptTimeoutMs?: number;
    retention?: number;
    incarnations?: Map<string, string>;
    requireRecovery?: boolean;
    logger?: Logger;
    /** A successor coordinator: the same participants, journal and clock as its predecessor's. */
    successorOf?: { fake: FakeParticipants; journal: MemoryDecisionJournal; clock: TestClock };
    epoch?: number;
    /** Config `expected_participants`. */
    expected?: { kind: Kind; instance: string }[];
    /** Config `request_slack_ms` (5000 unless given). */
    slackMs?: number;
    /** The engine's clock (a fresh TestClock unless given). */
    clock?: TestClock;
    /** The root holds this file, as the daemon's claim (ROOT_DEPLOYMENT_FILE): the catalog refuses a root without it. */
    claim?: string;
  } = {},
) {
  const members = options.members ?? FOUR_KINDS;
  const shared = options.successorOf;
  const fake = shared?.fake ?? new FakeParticipants(members);
  const clock = shared?.clock ?? options.clock ?? new TestClock();
  const journal = shared?.journal ?? new MemoryDecisionJournal();
  const catalog = new CheckpointCatalog(root, options.claim);
  const membership = new FakeMembership(members, options.incarnations);
  const leadership = new StaticLeadership(options.epoch ?? 7);
  const writer = new GlobalManifestWriter(catalog, options.retention ?? 2);
  writers.push(writer);
  fake.clock = clock;
  if (!shared) {
    const origRecord = journal.record.bind(journal);
    journal.record = async (entry) => {
      fake.events.push(`journal:${entry.state}`);
      await origRecord(entry);
    };
  }
  const engine = new CheckpointEngine({
    deployment: "unit",
    client: new ParticipantClient({
      transport: fake,
      deployment: "unit",
      token: "t",
      clock,
      slackMs: options.slackMs ?? 5000,
      ...(options.attemptTimeoutMs !== undefined && { attemptTimeoutMs: options.attemptTimeoutMs }),
    }),
    membership,
    leadership,
    journal,
    catalog,
    writer,
    clock,
    logger: options.logger ?? pino({ level: "silent" }),
    defaultTimeoutMs: 10_000,
    ...(options.requireRecovery && { requireRecovery: true }),
    ...(options.hooks && { hooks: options.hooks }),
    ...(options.expected && { expected: options.expected }),
  });
  return { engine, fake, clock, journal, catalog, leadership, writer, membership };
}

/** The membership view: fixed members, their incarnations (per `${kind}.${instance}`) as a test sets them. */
export class FakeMembership implements MembershipSource {
  private readonly listeners = new Map<string, Set<() => void>>();

  /** Members whose entry is gone (leave), by `${kind}.${instance}`: the list a test passed (FOUR_KINDS) stays as it is. */
  private readonly left = new Set<string>();

  constructor(
    private readonly members: { kind: Kind; instance: string }[],
    private readonly incarnations: Map<string, string> | undefined,
  ) {}

  async list(): Promise<ParticipantRef[]> {
    return this.members.filter((m) => !this.left.has(`${m.kind}.${m.instance}`));
  }

  incarnationOf(m: ParticipantRef): string | undefined {
    return this.incarnations?.get(`${m.kind}.${m.instance}`);
  }

  onIncarnationChange(m: ParticipantRef, listener: () => void): () => void {
    const key = `${m.kind}.${m.instance}`;
    const set = this.listeners.get(key) ?? new Set();
    this.listeners.set(key, set.add(listener));
    return () => set.delete(listener);
  }

  /** Watchers of the member's entry, for a test to check none is left behind. */
  watchers(m: ParticipantRef): number {
    return this.listeners.get(`${m.kind}.${m.instance}`)?.size ?? 0;
  }

  /** False: this coordinator's own connection is lost, its view not read since (viewCurrent). */
  current = true;

  viewCurrent(): boolean {
    return this.current;
  }

  /** Its entry is gone from the registry (its heartbeat lapsed, or it left): list() no longer shows it. */
  leave(m: ParticipantRef): void {
    this.left.add(`${m.kind}.${m.instance}`);
  }

  /** A restarted process announcing itself: the view now shows `incarnation`. */
  announce(m: ParticipantRef, incarnation: string): void {
    if (!this.incarnations) throw new Error("makeEngine({ incarnations }) to track incarnations");
    this.incarnations.set(`${m.kind}.${m.instance}`, incarnation);
    for (const listener of this.listeners.get(`${m.kind}.${m.instance}`) ?? []) listener();
  }
}

/** The journal entry goes once LATEST's rename is durable (a background fsync): waits for that. */
export async function journalEmptied(journal: MemoryDecisionJournal): Promise<void> {
  await waitUntil(() => journal.entries.size === 0, "the journal entry's removal", 5000);
}

/** A journal entry as a predecessor coordinator left it (every field overridable). */
export function journalEntry(fields: Pick<JournalEntry, "checkpoint_id" | "state" | "participants"> & Partial<JournalEntry>): JournalEntry {
  return { epoch: 3, prepared_at: 1, checkpoint_dir: null, scope: null, stop: false, restarts: [], auto_publish: true, controller_state: null, updated_at: 1, ...fields };
}

/** Writes one participant's files under `root/id` the way a participant does and returns its global entry. */
export async function writeParticipant(root: string, id: string, kind: Kind, instance: string, lines: string[]): Promise<ParticipantEntry> {
  const { manifest_path, manifest_sha256, records_sha256, record_count } = await writeParticipantFiles(join(root, id), kind, instance, lines);
  return { kind, instance, manifest_path, manifest_sha256, records_sha256, record_count, episode_ids: exportedKeys(lines), extras: {} };
}

/** Writes one participant's records and manifest.json into checkpoint directory `checkpointDir`. */
async function writeParticipantFiles(checkpointDir: string, kind: Kind, instance: string, lines: string[]) {
  const id = basename(checkpointDir);
  const dir = join(checkpointDir, "gym", kind, instance);
  await mkdir(dir, { recursive: true });
  const text = lines.map((l) => `${l}\n`).join("");
  const digest = sha256Hex(text);
  await writeFile(join(dir, `records-${digest}.jsonl`), text);
  const manifest = {
    schema_version: MANIFEST_SCHEMA_VERSION,
    kind,
    instance,
    checkpoint_id: id,
    records_file: `records-${digest}.jsonl`,
    records_sha256: digest,
    record_count: lines.length,
    created_at: 1,
    extra: {},
  };
  const manifestText = `${JSON.stringify(manifest, null, 2)}\n`;
  await writeFile(join(dir, "manifest.json"), manifestText);
  return {
    kind,
    instance,
    manifest,
    manifest_path: `gym/${kind}/${instance}/manifest.json`,
    manifest_sha256: sha256Hex(manifestText),
    records_sha256: digest,
    record_count: lines.length,
  };
}

/** What a commit reply lists for these record lines: their episodes' capture keys, sorted, unique (unparsable lines name none). */
function exportedKeys(lines: string[]): string[] {
  const keys = new Set<string>();
  for (const line of lines) {
    try {
      const episode = (JSON.parse(line) as { episode_id?: EpisodeId }).episode_id;
      if (episode) keys.add(captureKey(episode));
    } catch {
      // a deliberately corrupt line
    }
  }
  return [...keys].sort();
}

/** One participant of each kind. */
export const FOUR: { kind: Kind; instance: string }[] = [
  { kind: "environment", instance: "e1" },
  { kind: "model", instance: "m1" },
  { kind: "agent", instance: "a1" },
  { kind: "resources", instance: "r1" },
];

/** UUID rollout ids (one ending in `-a<digits>` would read as an attempt: drawn again). */
export function uuidScope(n: number): EpisodeId[] {
  const id = (): string => {
    const uuid = randomUUID();
    return /-a\d+$/.test(uuid) ? id() : uuid;
  };
  return Array.from({ length: n }, () => ({ rollout_id: id(), attempt: 0 }));
}

function isDirectory(path: string): boolean {
  return statSync(path, { throwIfNoEntry: false })?.isDirectory() ?? false;
}
