import { existsSync } from "node:fs";
import { join } from "node:path";
import { isDeepStrictEqual } from "node:util";
import { CheckpointError, ERROR_CODES, RESTORE_REFUSALS, RETIRE_STAGES, captureKey, nextAttempt, type EpisodeId, type Kind, type Op } from "../../../protocol/index.js";
import type { CheckpointEngine } from "../../../coordinator/engine/checkpoint-engine.js";
import { participantFailurePrefix } from "../../../coordinator/engine/participant-client.js";
import type { MemoryDecisionJournal } from "../../../coordinator/ha/decision-journal.js";
import { FOUR, makeEngine, type FakeParticipants, type TestClock } from "./fake-participants.js";
import { CoordinatorConfigSchema } from "../../../coordinator/config/coordinator-config.js";
import { DEFAULT_REPLY_SLACK_MS } from "../../../coordinator/client/reply-decoder.js";
import { InvariantViolation } from "../../support/seeded-model-run.js";

/**
 * The coordinator engine (over FakeParticipants, a TestClock, a MemoryDecisionJournal and a real
 * catalog in a temp directory) driven by random controller ops from a seeded PRNG, with participant
 * faults, lease expiries and leadership losses between them. No full reference model: after every
 * step, the invariants docs/api.md promises over the engine's state (see check*). Every step is
 * logged (`steps`), so a failure names the sequence that led to it.
 */


/** An op still pending after this long (no real timers; every fault answers at once) hangs. */
const HANG_MS = 5_000;
/** The daemon's default request_slack_ms: docs/api.md bounds a failing op's reply by it ("inside the clients' default 10 s wait"). */
const SLACK_MS = CoordinatorConfigSchema.parse({ token: "t", checkpoint_root: "/c" }).request_slack_ms;
/** makeEngine's default_timeout_ms: the deadline of an op sent without one. */
const DEFAULT_TIMEOUT_MS = 10_000;
const ROLLOUTS: EpisodeId[] = [
  { rollout_id: "r1", attempt: 0 },
  { rollout_id: "r2", attempt: 0 },
  { rollout_id: "r3", attempt: 1 },
];
/** The ops a fault is scripted for: every phase message the engine sends (status stays honest). */
const FAULT_OPS: Op[] = ["prepare", "commit", "resume", "restore", "retire", "forget", "renew"];
type Fault = "unreachable" | "timeout" | "late" | "delayed" | "slow" | { error: string };
/**
 * Transport faults (no responders; a try timing out before it reached the participant; `late`: done
 * there, its reply after the try's timeout, a stalled participant) and refusal codes a participant is
 * scripted to answer: none of them one of NOTHING_CHANGED's.
 */
const FAULTS: Fault[] = ["unreachable", "timeout", "late", { error: "storage_error" }];
/**
 * A participant's own deadline (fake-participants answerSlow, refusedForDeadline): the request
 * reaches it only at its deadline (`delayed`: refused `deadline_exceeded`, or a restore's in-time
 * refusal), or its kind's hook runs past it (`slow`). Never scripted for resume, which no deadline
 * refuses (a delayed or slow resume still resumes). Their `deadline_exceeded` is told from the
 * coordinator's own (NOTHING_CHANGED) by its detail's prefix, as any participant's code.
 */
const DEADLINE_FAULTS: Fault[] = ["delayed", "slow"];
/** Ops whose participant messages a `<op>` controller op's success stands on (a refusal of one for its deadline is that op's failure). */
const PHASE_MESSAGES: Partial<Record<CtlOp, Op[]>> = {
  prepare: ["prepare"],
  commit: ["commit"],
  checkpoint: ["prepare", "commit"],
  restore: ["restore"],
  renew: ["renew"],
  retire: ["retire"],
  forget: ["forget"],
};
/** A restore refused with a code that promises nothing was installed (RESTORE_REFUSALS): a process already resumed from it. */
const RESTORE_FAULTS: Fault[] = [{ error: "stale_checkpoint" }];

/** Restore refusals of a participant parked in another checkpoint: the clean-up's resume lets it go (docs/api.md "restore"). */
const PARKED_ELSEWHERE: ReadonlySet<string> = new Set(["invalid_phase", "checkpoint_conflict"]);

/** Codes of a checkpoint op that ran and aborted its id here (the participants' codes this model scripts, and the journal's). */
const ABORTED: ReadonlySet<string> = new Set(["prepare_incomplete", "journal_unavailable", "storage_error", "unreachable"]);

type CtlOp = "checkpoint" | "prepare" | "commit" | "publish" | "resume" | "restore" | "retire" | "forget" | "renew" | "status" | "list" | "get";
type Outcome = { ok: true; reply: unknown } | { ok: false; error: unknown };

/**
 * docs/api.md: "a refused request changes nothing". The codes whose refusal promises it whatever
 * the participants do here (they never answer these codes: FAULTS), per op. A participant's own
 * code, `outcome_unknown` and the restore's all-refused answer are not among them.
 */
const NOTHING_CHANGED: Partial<Record<CtlOp, ReadonlySet<string>>> = {
  prepare: new Set(["invalid_request", "invalid_phase", "checkpoint_conflict", "not_found", "stale_checkpoint", "deadline_exceeded"]),
  commit: new Set(["invalid_request", "invalid_phase", "checkpoint_conflict", "not_found", "stale_checkpoint", "deadline_exceeded"]),
  publish: new Set(["invalid_request", "invalid_phase", "checkpoint_conflict", "not_found", "stale_checkpoint"]),
  resume: new Set(["invalid_request", "checkpoint_conflict", "not_found", "deadline_exceeded"]),
  renew: new Set(["invalid_request", "checkpoint_conflict", "not_found", "stale_checkpoint", "deadline_exceeded"]),
  checkpoint: new Set(["invalid_request", "checkpoint_conflict", "not_found", "stale_checkpoint", "deadline_exceeded"]),
  restore: new Set(["invalid_request", "invalid_phase", "not_found", "deadline_exceeded"]),
  retire: new Set(["invalid_request", "invalid_phase", "checkpoint_conflict", "not_found", "deadline_exceeded"]),
  forget: new Set(["invalid_request", "invalid_phase", "checkpoint_conflict", "not_found", "deadline_exceeded"]),
};

interface Snapshot {
  open: unknown;
  journal: string;
  /** The journal's restore outcome records (MemoryDecisionJournal.outcomes), sorted by id. */
  outcomes: string;
  latest: string | null;
  phaseCalls: number;
}

export class EngineWorld {
  readonly steps: string[] = [];
  private engine: CheckpointEngine;
  private readonly fake: FakeParticipants;
  private readonly clock: TestClock;
  private readonly journal: MemoryDecisionJournal;
  private fixture: ReturnType<typeof makeEngine>;
  private epoch = 7;
  private nextId = 0;
  private journalFault: "none" | "lost" | "landed" = "none";
  /** Journal writes that still work before journalFault applies (a restore's `restoring` write, not its `restored` one). */
  private journalWritesBeforeFault = 0;
  /** The membership view's incarnations (shared by every coordinator here); the participants' own are fake.incarnation. */
  private readonly view = new Map(FOUR.map((m) => [`${m.kind}.${m.instance}`, `${m.kind}-${m.instance}-0`]));
  /** Restarted processes the view does not show yet (their announcement not seen). */
  private readonly lagging = new Map<string, string>();
  /** Restored checkpoints a holder of which restarted before their resume (this leadership term): "the resume ... answers restore_failed". */
  private readonly lostRestores = new Set<string>();
  private readonly ids: string[] = [];
  /** Attempts a restore clean-up (not a controller's retire) retired, per participant (see noteCleanupRetires). */
  private readonly cleanupRetired = new Map<string, Set<string>>();
  /** The scope of each restore answered ok, for its resume's check. */
  private readonly restoredScopes = new Map<string, EpisodeId[]>();
  /** The last controller op run, for a retry of it (its reply lost), and how it ended. */
  private last: { op: CtlOp; request: Record<string, unknown>; outcome: Outcome; faultsSince: number; failedOver: boolean } | undefined;

  constructor(
    private readonly random: () => number,
    private readonly root: string,
  ) {
    this.fixture = makeEngine(root, { members: FOUR, incarnations: this.view, slackMs: SLACK_MS });
    ({ engine: this.engine, fake: this.fake, clock: this.clock, journal: this.journal } = this.fixture);
    for (const [key, incarnation] of this.view) this.fake.incarnation.set(key, incarnation);
    // Each process remembers the ids it resumed and whether it holds live state, as a real one does.
    this.fake.memory = true;
    // A KV put whose acknowledgement never comes (a timeout), landed or not, while journalFault says so.
    const record = this.journal.record.bind(this.journal);
    this.journal.record = async (entry) => {
      if (this.journalFault !== "none" && this.journalWritesBeforeFault > 0) {
        this.journalWritesBeforeFault--;
        return record(entry);
      }
      if (this.journalFault === "landed") await record(entry);
      if (this.journalFault !== "none") throw new Error("TIMEOUT (scripted journal fault)");
      await record(entry);
    };
  }

  async step(): Promise<void> {
    const r = this.random();
    if (r < 0.12) return this.toggleFault();
    if (r < 0.15) return this.expireLease();
    if (r < 0.16) return this.toggleJournalFault();
    if (r < 0.17) return this.loseLeadership();
    if (r >= 0.9 && r < 0.93) return this.restart();
    if (r >= 0.93 && r < 0.94) return this.catchUpView();
    if (r >= 0.94 && r < 0.96) return this.serve();
    if (r >= 0.96 && r < 0.98) return this.restartAndRestore();
    if (r >= 0.98 && r < 0.99) return this.restoreThenFailover();
    // A retry is likeliest right after the op it repeats succeeded (its reply lost), or a restore every participant refused (RESTORE_FAULTS).
    if (this.last && r < (this.last.outcome.ok || this.refusedEverywhere(this.last) ? 0.35 : 0.22)) return this.retryLast();
    if (r < 0.3) return this.runWithConcurrentRetry();
    if (r < 0.33) return this.runTwoAtOnce();
    if (r < 0.37) return this.retireAroundRestore();
    if (r < 0.39) return this.deadlineAtParticipant();
    return this.runOp(this.pickOp());
  }

  async close(): Promise<void> {
    await this.settle();
  }

  // ---- steps ------------------------------------------------------------------------------

  private async toggleFault(): Promise<void> {
    const faulted = [...this.fake.script.keys()];
    const r = this.random();
    if (faulted.length > 1 && r < 0.1) {
      this.fake.script.clear();
      this.steps.push("heal every participant");
    } else if (r > 0.85) {
      // The trainer restarted alone: every Gym process already resumed from what it restores, and refuses it.
      for (const m of FOUR) this.fake.set(m.kind, m.instance, "restore", RESTORE_FAULTS[0]!);
      this.steps.push(`fault every participant's restore ${JSON.stringify(RESTORE_FAULTS[0])}`);
    } else if (faulted.length > 0 && r < 0.5) {
      const key = this.pick(faulted);
      this.fake.script.delete(key);
      this.steps.push(`heal ${key}`);
    } else {
      const member = this.pick(FOUR);
      const op = this.pick(FAULT_OPS);
      const key = `${member.kind}.${member.instance}.${op}`;
      const fault = this.pick(op === "restore" ? [...FAULTS, ...DEADLINE_FAULTS, ...RESTORE_FAULTS] : op === "resume" ? FAULTS : [...FAULTS, ...DEADLINE_FAULTS]);
      this.fake.set(member.kind, member.instance, op, fault);
      this.steps.push(`fault ${key} ${JSON.stringify(fault)}`);
    }
    if (this.last) this.last.faultsSince++;
  }

  /** The decision journal's writes time out (landed or not), or work again. */
  private async toggleJournalFault(): Promise<void> {
    this.journalFault = this.journalFault !== "none" ? "none" : this.random() < 0.5 ? "lost" : "landed";
    this.steps.push(`journal writes ${this.journalFault === "none" ? "work again" : `time out (${this.journalFault})`}`);
    if (this.last) this.last.faultsSince++;
  }

  /** A participant's lease expired: it resumed by itself (status idle), fencing the id it held. */
  private async expireLease(): Promise<void> {
    const member = this.pick(FOUR);
    this.fake.leaseExpired(member.kind, member.instance);
    this.steps.push(`lease expired at ${member.kind}.${member.instance}`);
    if (this.last) this.last.faultsSince++;
  }

  /**
   * A participant's process restarted (a crash, its supervisor starting it again): a new incarnation
   * holding nothing. Its announcement reaches the coordinator's view at once, or later (catchUpView).
   */
  private async restart(): Promise<void> {
    await this.restartMember(this.pick(FOUR));
  }

  private async restartMember(member: { kind: Kind; instance: string }): Promise<void> {
    const key = `${member.kind}.${member.instance}`;
    const open = this.engine.openCheckpoint;
    if (open?.phase === "restored" && this.fake.state.get(key)?.checkpoint_id === open.checkpoint_id) this.lostRestores.add(open.checkpoint_id);
    const incarnation = this.fake.restart(member.kind, member.instance);
    this.cleanupRetired.delete(key); // its marks went with the process
    const announced = this.random() < 0.6;
    if (announced) {
      this.lagging.delete(key);
      this.fixture.membership.announce(member, incarnation);
    } else {
      this.lagging.set(key, incarnation);
    }
    this.steps.push(`restart ${key} as ${incarnation}${announced ? "" : " (the view still shows the old process)"}`);
    if (this.last) this.last.faultsSince++;
  }

  /** The trainer's rollouts reach one process, or every one: they hold live state (no longer fresh) until they restart. */
  private async serve(members = this.random() < 0.3 ? FOUR : [this.pick(FOUR)]): Promise<void> {
    if (members.length === 0) return;
    for (const m of members) this.fake.memoryOf(`${m.kind}.${m.instance}`).live = true;
    this.steps.push(`rollouts run at ${members.map((m) => `${m.kind}.${m.instance}`).join(", ")} (live state: not fresh)`);
    if (this.last) this.last.faultsSince++;
  }

  /**
   * A job restarted (every process, or only some: the others already resumed from LATEST or
   * serving, not fresh) and its controller restores LATEST: the restore meets fresh processes,
   * fenced ones and live ones at once.
   */
  private async restartAndRestore(): Promise<void> {
    const members = this.random() < 0.4 ? FOUR : FOUR.filter(() => this.random() < 0.5);
    for (const m of members) await this.restartMember(m);
    // Rollouts reach some processes before the restore (a restarted one too: its supervisor started it, the trainer sent it work).
    if (this.random() < 0.5) await this.serve(FOUR.filter(() => this.random() < 0.5));
    const request = { ...this.deadline(), episode_ids: this.subset() };
    this.steps.push(`restore ${JSON.stringify(request)}`);
    const outcome = await this.execute("restore", request);
    this.last = { op: "restore", request, outcome, faultsSince: 0, failedOver: false };
  }

  /**
   * A restore whose `restored` write is lost (its entry still says `restoring`), then processes
   * restarting (fresh: they install it when it is re-sent) and another one failing it, and a
   * failover: the successor re-sends it and cleans it up where it may have been installed.
   */
  private async restoreThenFailover(): Promise<void> {
    this.journalFault = "lost";
    this.journalWritesBeforeFault = 1;
    this.steps.push("journal writes time out (lost) after the next one");
    await this.restartAndRestore();
    this.journalFault = "none";
    this.journalWritesBeforeFault = 0;
    this.steps.push("journal writes work again");
    await this.restartMember(this.pick(FOUR));
    const member = this.pick(FOUR);
    const fault = this.pick([...FAULTS, ...DEADLINE_FAULTS]);
    this.fake.set(member.kind, member.instance, "restore", fault);
    this.steps.push(`fault ${member.kind}.${member.instance}.restore ${JSON.stringify(fault)}`);
    await this.loseLeadership();
  }

  /** The restarted processes' announcements reach the coordinator's view. */
  private async catchUpView(): Promise<void> {
    this.steps.push(`the view catches up${this.lagging.size ? ` (${[...this.lagging.values()].join(", ")})` : " (nothing lags)"}`);
    for (const [key, incarnation] of this.lagging) {
      const [kind, instance] = key.split(".") as [Kind, string];
      this.fixture.membership.announce({ kind, instance }, incarnation);
    }
    this.lagging.clear();
    if (this.last) this.last.faultsSince++;
  }

  /** Leadership lost: either won back by this engine (recover) or taken by a successor of a higher epoch. */
  private async loseLeadership(): Promise<void> {
    const before = await this.snapshot();
    this.lostRestores.clear(); // recovery may send the restore again: a restarted holder installs it anew
    this.engine.leadershipLost();
    if (this.random() < 0.5) {
      this.steps.push("leadership lost and regained (recover)");
    } else {
      this.fixture.leadership.demote();
      await this.settle();
      this.epoch++;
      this.fixture = makeEngine(this.root, {
        members: FOUR,
        successorOf: { fake: this.fake, journal: this.journal, clock: this.clock },
        epoch: this.epoch,
        requireRecovery: true,
        incarnations: this.view,
        slackMs: SLACK_MS,
      });
      this.engine = this.fixture.engine;
      this.steps.push(`failover to a successor (epoch ${this.epoch}, recover)`);
    }
    const calledBefore = this.fake.calls.length;
    const installsBefore = this.fake.installs.length;
    let outcome = await this.bounded("recover", this.engine.recover());
    this.steps[this.steps.length - 1] += ` → ${describe(outcome)}`;
    // A recovery that rejects keeps the gate shut (the daemon serves no op) and is tried again:
    // here once JetStream works again, so no op runs beside what it left unfinished.
    for (let tries = 0; !outcome.ok && tries < 3; tries++) {
      this.checkThrown("recover", outcome);
      this.journalFault = "none";
      outcome = await this.bounded("recover", this.engine.recover());
      this.steps[this.steps.length - 1] += `; journal works again, recover again → ${describe(outcome)}`;
    }
    if (!outcome.ok) this.fail("recovery still fails with the journal working");
    if (this.last) this.last.failedOver = true;
    await this.settle();
    this.checkThrown("recover", outcome);
    await this.checkAlways(before, "recover", outcome);
    this.checkRecoveredRestoreCleanup(calledBefore, installsBefore);
    this.noteCleanupRetires("recover", calledBefore);
  }

  /**
   * A restore re-driven in recovery that was cleaned up (attempt+1 retired) retired it at every
   * process that installed it then: "attempt+1 retired where it may have been installed".
   */
  private checkRecoveredRestoreCleanup(calledBefore: number, installsBefore: number): void {
    const sent = this.fake.calls.slice(calledBefore);
    const restore = sent.find((c) => c.op === "restore");
    if (!restore) return;
    const id = restore.body["checkpoint_id"];
    const retired = new Set(sent.filter((c) => c.op === "retire" && c.body["checkpoint_id"] === id).map((c) => `${c.kind}.${c.instance}`));
    if (retired.size === 0) return;
    const unretired = this.fake.installs.slice(installsBefore).map((m) => m.replace("/", ".")).filter((key) => !retired.has(key));
    if (unretired.length > 0) this.fail(`recovery re-sent the restore of ${String(id)} and cleaned it up, but attempt+1 was not retired at ${unretired.join(", ")}, which installed it`);
  }

  private refusedEverywhere(last: NonNullable<EngineWorld["last"]>): boolean {
    return last.op === "restore" && !last.outcome.ok && refusedByEveryParticipant(last.outcome.error as CheckpointError);
  }

  private async retryLast(): Promise<void> {
    const last = this.last!;
    // A lost reply: the client retries once its wait (deadline_ts + slack) is over.
    const late = this.random() < 0.5;
    if (late) this.clock.current += 70_000;
    this.steps.push(`retry${late ? " (70 s later)" : ""} ${last.op} ${JSON.stringify(last.request)}`);
    const calledBefore = this.fake.calls.length;
    const outcome = await this.execute(last.op, last.request);
    this.checkRetry(last, outcome, late);
    // A restore retried with its deadline ahead is sent again: its outcome, not the first one's, answers a later retry.
    if (last.op === "restore" && this.fake.calls.slice(calledBefore).some((c) => c.op === "restore")) this.last = { ...last, outcome, faultsSince: 0, failedOver: false };
  }

  private checkRetry(last: NonNullable<EngineWorld["last"]>, outcome: Outcome, late: boolean): void {
    // A retire or forget done everywhere, sent again at once (its reply lost; nothing happened since
    // but maybe a failover): participants repeat it idempotently (marks again; control-plane retire,
    // forget keep no reply), so it is done again, listing the same.
    const deadline = last.request["deadline_ts"] as number | undefined;
    if ((last.op === "retire" || last.op === "forget") && last.outcome.ok && last.faultsSince === 0 && !late && (deadline === undefined || deadline * 1000 > this.clock.now())) {
      if (!outcome.ok || !isDeepStrictEqual(outcome.reply, last.outcome.reply)) this.fail(`a ${last.op} done everywhere, sent again at once${last.failedOver ? " after a failover" : ""}, answered ${describe(outcome)}`);
    }
    if (last.op === "checkpoint" && !last.outcome.ok && !last.failedOver) {
      // "Retried after it failed and its id was closed here (aborted ...), it gets that failure again (the same code and detail)"
      const code = (last.outcome.error as CheckpointError).code;
      const again = outcome.ok ? "ok" : (outcome.error as CheckpointError).code;
      // A participant's refusal for its deadline aborts it too (not the coordinator's own deadline_exceeded: it never ran).
      const participants = ["prepare", "commit"].some((p) => (last.outcome as { error: Error }).error.message.startsWith(participantFailurePrefix(p)));
      if ((ABORTED.has(code) || (code === "deadline_exceeded" && participants)) && again !== code) this.fail(`a checkpoint that failed with ${code} was retried: ${describe(outcome)}`);
    }
    if (last.op === "restore" && !last.outcome.ok && !last.failedOver && late) {
      // "Retried ... once its deadline_ts has passed (its reply was lost) gets that refusal again" (a restore every participant refused).
      const code = (last.outcome.error as CheckpointError).code;
      const deadline = last.request["deadline_ts"] as number | undefined;
      const again = outcome.ok ? "ok" : (outcome.error as CheckpointError).code;
      if (refusedByEveryParticipant(last.outcome.error as CheckpointError) && deadline !== undefined && deadline * 1000 <= this.clock.now() && again !== code) {
        this.fail(`a restore every participant refused (${code}) was retried past its deadline: ${describe(outcome)}`);
      }
    }
    if (!last.outcome.ok || !outcome.ok) return;
    // "a retry with the same id and arguments ... gets the op's reply" (docs/api.md "Retrying a controller op")
    if (last.failedOver) {
      // Across coordinators only a publication's reply is rebuilt (from checkpoint.json): the same checkpoint, its lists aside.
      if ((last.op === "checkpoint" || last.op === "publish") && !isDeepStrictEqual(publication(outcome.reply), publication(last.outcome.reply))) {
        this.fail(`a retry after a failover of a ${last.op} that succeeded answered ${JSON.stringify(outcome.reply)}, not ${JSON.stringify(last.outcome.reply)}`);
      }
      return;
    }
    const same = ["checkpoint", "commit", "publish", "restore"].includes(last.op) || (last.op === "prepare" && last.faultsSince === 0 && !late);
    if (same && !isDeepStrictEqual(outcome.reply, last.outcome.reply)) {
      this.fail(`a retry of a ${last.op} that succeeded answered ${JSON.stringify(outcome.reply)}, not ${JSON.stringify(last.outcome.reply)}`);
    }
  }

  private async runOp(op: CtlOp, request = this.requestFor(op)): Promise<void> {
    this.steps.push(`${op} ${JSON.stringify(request)}`);
    const outcome = await this.execute(op, request);
    this.last = { op, request, outcome, faultsSince: 0, failedOver: false };
  }

  /**
   * A participant's own deadline in the op that meets it: one member gets its message only at the
   * deadline (`delayed`) or its kind's hook outlives it (`slow`), for the phase message of an op
   * run now (a restore of LATEST into fresh processes), healed after.
   */
  private async deadlineAtParticipant(): Promise<void> {
    const member = this.pick(FOUR);
    const op = this.pick<Op>(["prepare", "commit", "restore", "retire", "forget", "renew"]);
    const fault = this.pick(DEADLINE_FAULTS);
    const key = `${member.kind}.${member.instance}.${op}`;
    const before = this.fake.script.get(key);
    this.fake.set(member.kind, member.instance, op, fault);
    this.steps.push(`fault ${key} ${JSON.stringify(fault)}`);
    const deadline = { deadline_ts: this.clock.now() / 1000 + 60 };
    if (op === "restore") {
      if ((await this.fixture.catalog.latest()) === null) await this.runOp("checkpoint", { checkpoint_id: this.id(), episode_ids: this.subset(), stop: false, controller_state: null });
      for (const m of FOUR) if (this.random() < 0.8) await this.restartMember(m);
      await this.runOp("restore", { ...deadline, episode_ids: this.subset() });
    } else if (op === "prepare" || op === "commit") {
      const ctl: CtlOp = this.random() < 0.5 ? "checkpoint" : "prepare";
      await this.runOp(ctl, { ...this.requestFor(ctl), ...deadline });
      const open = this.engine.openCheckpoint;
      if (open?.phase === "prepared") await this.runOp("commit", { checkpoint_id: open.checkpoint_id, ...deadline, episode_ids: this.subset(), stop: false });
    } else {
      await this.runOp(op as CtlOp, { ...this.requestFor(op as CtlOp), ...deadline });
    }
    if (before === undefined) this.fake.script.delete(key);
    else this.fake.script.set(key, before);
    this.steps.push(`heal ${key}`);
    if (this.last) this.last.faultsSince++;
  }

  /**
   * Retire and forget where the phase rules bite: after a restore (of fresh processes, or of
   * processes that served), naming the restored id, none or another, of its replacement attempts
   * or its source attempts; then maybe a forget of those rollouts and the restore's resume.
   * Retried after a lost reply and across failovers by the steps that follow (retryLast).
   */
  private async retireAroundRestore(): Promise<void> {
    if (this.random() < 0.7) {
      // Something to restore: LATEST, published now if there is none.
      if ((await this.fixture.catalog.latest()) === null) await this.runOp("checkpoint", { checkpoint_id: this.id(), episode_ids: this.subset(), stop: false, controller_state: null });
      if (this.random() < 0.7) for (const m of FOUR) await this.restartMember(m);
      await this.runOp("restore", { ...(this.random() < 0.2 && { checkpoint_id: this.id() }), ...(this.random() < 0.7 ? {} : this.deadline()), episode_ids: this.subset() });
    }
    const open = this.engine.openCheckpoint;
    const scope = (open && this.journal.entries.get(open.checkpoint_id)?.scope) || this.subset();
    const r = this.random();
    const named = r < 0.6 && open ? { checkpoint_id: open.checkpoint_id } : r < 0.8 ? {} : { checkpoint_id: this.id() };
    await this.runOp("retire", { ...named, ...this.deadline(), episode_ids: scope.map((e) => (this.random() < 0.7 ? nextAttempt(e) : e)) });
    if (this.random() < 0.5) await this.runOp("forget", { ...named, ...this.deadline(), rollout_ids: [...new Set(scope.map((e) => e.rollout_id))] });
    if (open && this.random() < 0.4) await this.runOp("resume", { checkpoint_id: open.checkpoint_id, ...this.deadline() });
  }

  /**
   * An op and its retry sent while it still runs (the client gave up on a slow reply): "a retry
   * waiting for the op it repeats ... waits for it however long it takes and gets its reply".
   * Only the global invariants are checked after both (the per-op ones assume one op at a time).
   */
  private async runWithConcurrentRetry(): Promise<void> {
    const op = this.pick<CtlOp>(["checkpoint", "commit", "publish", "restore", "prepare", "resume"]);
    const request = this.requestFor(op);
    this.steps.push(`${op} and its retry at once ${JSON.stringify(request)}`);
    const before = await this.snapshot();
    const calledBefore = this.fake.calls.length;
    const [first, second] = await Promise.all([this.bounded(op, this.call(op, request)), this.bounded(`${op} retry`, this.call(op, request))]);
    this.steps[this.steps.length - 1] += ` → ${describe(first)} | retry → ${describe(second)}`;
    await this.settle();
    this.checkThrown(op, first);
    this.checkThrown(op, second);
    this.noteRestored(calledBefore, op, first);
    this.noteRestored(calledBefore, op, second);
    this.noteCleanupRetires(op, calledBefore);
    await this.checkAlways(before, op, first.ok ? first : second);
    if (first.ok && second.ok && ["checkpoint", "commit", "publish", "restore"].includes(op) && !isDeepStrictEqual(first.reply, second.reply)) {
      this.fail(`a ${op} and its concurrent retry answered differently`);
    }
    if (op === "checkpoint" && !first.ok && (first.error as CheckpointError).code !== "outcome_unknown") {
      const [a, b] = [first.error as CheckpointError, second.ok ? undefined : (second.error as CheckpointError)];
      if (b?.code !== a.code) this.fail(`a checkpoint failed with ${a.code}, its concurrent retry answered ${describe(second)}`);
    }
    this.last = { op, request, outcome: first, faultsSince: 0, failedOver: false };
  }

  /** Two different controller ops at once (two controllers, or a status beside a checkpoint): only catalog codes, and the global invariants. */
  private async runTwoAtOnce(): Promise<void> {
    const ops = [this.pickOp(), this.pickOp()];
    const requests = ops.map((op) => this.requestFor(op));
    this.steps.push(`at once: ${ops.map((op, i) => `${op} ${JSON.stringify(requests[i])}`).join(" | ")}`);
    const before = await this.snapshot();
    const calledBefore = this.fake.calls.length;
    const outcomes = await Promise.all(ops.map((op, i) => this.bounded(op, this.call(op, requests[i]!))));
    this.steps[this.steps.length - 1] += ` → ${outcomes.map(describe).join(" | ")}`;
    await this.settle();
    outcomes.forEach((outcome, i) => this.checkThrown(ops[i]!, outcome));
    outcomes.forEach((outcome, i) => this.noteRestored(calledBefore, ops[i]!, outcome));
    // Not beside a controller's retire: its messages and a restore clean-up's are not told apart here.
    if (!ops.includes("retire")) this.noteCleanupRetires(ops[0]!, calledBefore);
    // Both may publish (two checkpoints): LATEST names the one that published last.
    const latest = (await this.snapshot()).latest;
    const publisher = outcomes.findIndex((o, i) => o.ok && (ops[i] === "publish" || ops[i] === "checkpoint") && (o.reply as { checkpoint_id: string }).checkpoint_id === latest);
    await this.checkAlways(before, publisher >= 0 ? ops[publisher]! : ops[0]!, publisher >= 0 ? outcomes[publisher]! : outcomes[0]!);
    this.last = undefined;
  }

  // ---- requests ----------------------------------------------------------------------------

  private pickOp(): CtlOp {
    const weighted: [CtlOp, number][] = [
      ["checkpoint", 5],
      ["prepare", 5],
      ["commit", 4],
      ["publish", 4],
      ["resume", 5],
      ["restore", 4],
      ["retire", 4],
      ["forget", 3],
      ["renew", 2],
      ["status", 1],
      ["list", 1],
      ["get", 1],
    ];
    let r = this.random() * weighted.reduce((sum, [, w]) => sum + w, 0);
    for (const [op, w] of weighted) if ((r -= w) < 0) return op;
    return "status";
  }

  private requestFor(op: CtlOp): Record<string, unknown> {
    const deadline = this.deadline();
    const id = this.id();
    switch (op) {
      case "checkpoint":
        return { checkpoint_id: id, ...deadline, episode_ids: this.scope(), stop: this.random() < 0.15, controller_state: this.state() };
      case "prepare":
      case "resume":
      case "renew":
        return { checkpoint_id: id, ...deadline };
      case "commit":
        return { checkpoint_id: id, ...deadline, episode_ids: this.scope(), stop: this.random() < 0.1 };
      case "publish":
        return { checkpoint_id: id, controller_state: this.state() };
      case "restore": {
        const episodes = this.subset();
        return { ...(this.random() < 0.5 && { checkpoint_id: id }), ...deadline, episode_ids: episodes };
      }
      case "retire":
        // A source attempt, or the attempt a restore continues it as (the clean-up's retire, sent by a controller).
        return { ...(this.random() < 0.5 && { checkpoint_id: id }), ...deadline, episode_ids: this.subset().map((e) => (this.random() < 0.3 ? nextAttempt(e) : e)) };
      case "forget":
        return { ...(this.random() < 0.5 && { checkpoint_id: id }), ...deadline, rollout_ids: [...new Set(this.subset().map((e) => e.rollout_id))] };
      case "get":
        return { checkpoint_id: id };
      case "status":
      case "list":
        return {};
    }
  }

  /** A fresh id, the open one, or one used before. */
  private id(): string {
    const open = this.engine.openCheckpoint?.checkpoint_id;
    const r = this.random();
    if (open && r < 0.6) return open;
    if (this.ids.length > 0 && r < 0.75) return this.pick(this.ids);
    const id = `c${this.nextId++}`;
    this.ids.push(id);
    return id;
  }

  private deadline(): { deadline_ts?: number } {
    const r = this.random();
    if (r < 0.5) return {};
    if (r < 0.87) return { deadline_ts: this.clock.now() / 1000 + 60 };
    if (r < 0.9) return { deadline_ts: this.clock.now() }; // milliseconds sent as seconds: more than 7 days ahead
    return { deadline_ts: this.clock.now() / 1000 - 5 }; // already past
  }

  private scope(): EpisodeId[] | null {
    return this.random() < 0.2 ? null : this.subset();
  }

  private subset(): EpisodeId[] {
    const chosen = ROLLOUTS.filter(() => this.random() < 0.6);
    // Now and then one rollout at two attempts, which every scope refuses (invalid_request).
    if (this.random() < 0.04) chosen.push({ rollout_id: "r1", attempt: 1 });
    return chosen.length > 0 ? chosen : [ROLLOUTS[0]!];
  }

  private state(): { inline: unknown } | null {
    return this.random() < 0.5 ? null : { inline: { step: Math.floor(this.random() * 3) } };
  }

  private pick<T>(items: readonly T[]): T {
    return items[Math.floor(this.random() * items.length)]!;
  }

  // ---- running and checking ----------------------------------------------------------------

  /**
   * A restore that succeeded sending it (not a retry answered from the open one; also one sent
   * again after the engine closed a restored checkpoint nobody held) is held by the processes there now.
   */
  private noteRestored(calledBefore: number, op: CtlOp, outcome: Outcome): void {
    if (op !== "restore" || !outcome.ok) return;
    const id = (outcome.reply as { checkpoint_id: string }).checkpoint_id;
    if (this.fake.calls.slice(calledBefore).some((c) => c.op === "restore" && c.body["checkpoint_id"] === id)) this.lostRestores.delete(id);
  }

  private async execute(op: CtlOp, request: Record<string, unknown>): Promise<Outcome> {
    const before = await this.snapshot();
    const calledBefore = this.fake.calls.length;
    const installsBefore = this.fake.installs.length;
    const startedAt = this.clock.now();
    const outcome = await this.bounded(op, this.call(op, request));
    const answeredAt = this.clock.now();
    this.steps[this.steps.length - 1] += ` → ${describe(outcome)}`;
    await this.settle();
    this.checkThrown(op, outcome);
    this.noteRestored(calledBefore, op, outcome);
    await this.checkAlways(before, op, outcome);
    this.checkAnsweredInTime(op, request, before, calledBefore, startedAt, answeredAt);
    if (op === "resume") this.checkResumedEverywhere(request, outcome, calledBefore);
    if (op === "restore") await this.checkRestoreRefusals(before, outcome, calledBefore, installsBefore);
    if (op === "retire" || op === "forget") await this.checkRetireForget(op, request, before, outcome, calledBefore);
    this.checkDeadlineRefusals(op, outcome, calledBefore);
    if (op === "restore") this.checkTimedOutRestore(outcome, calledBefore);
    this.noteCleanupRetires(op, calledBefore);
    this.checkNothingRetiredContinues(op, request, before, outcome);
    if ((op === "commit" || op === "checkpoint") && outcome.ok) this.checkCommittedEverywhere(op, (outcome.reply as { checkpoint_id: string }).checkpoint_id);
    if (!outcome.ok) {
      const code = (outcome.error as CheckpointError).code;
      // "the op ran and failed at these participants" (their own code, e.g. a parked one's checkpoint_conflict) is told by the detail's prefix.
      // A checkpoint's names the phase that failed there (prepare or commit).
      const participants = (op === "checkpoint" ? ["prepare", "commit"] : [op]).some((p) => (outcome.error as CheckpointError).message.startsWith(participantFailurePrefix(p)));
      if (NOTHING_CHANGED[op]?.has(code) && !participants) await this.checkNothingChanged(before, op, code);
      if (op === "restore" && code === "stale_checkpoint") {
        // Every participant refused it so: "nothing retired or resumed, no failure remembered, the journal entry removed before the reply".
        const cleanup = this.fake.calls.slice(calledBefore).filter((c) => c.op === "retire" || c.op === "resume");
        if (cleanup.length > 0) this.fail(`restore refused by every participant (stale_checkpoint), yet ${cleanup.map((c) => `${c.op}:${c.kind}/${c.instance}`).join(", ")} sent`);
        if (this.changedBesidesStaleClose(before, await this.snapshot())) this.fail(`restore refused by every participant (stale_checkpoint) changed the journal or the open checkpoint`);
      }
      return outcome;
    }
    const id = (outcome.reply as { checkpoint_id?: string }).checkpoint_id;
    // "A participant that restarts between restore and resume lost what it restored: the resume runs the same clean-up everywhere and answers restore_failed"
    if (op === "resume" && id !== undefined && this.lostRestores.has(id)) this.fail(`a participant holding restored ${id} restarted before its resume, yet the resume answered ${describe(outcome)}`);
    if (op === "resume" && id !== undefined) {
      const holders = [...this.fake.state].filter(([, s]) => s.checkpoint_id === id).map(([key, s]) => `${key} (${s.phase})`);
      if (holders.length > 0) this.fail(`resume of ${id} succeeded, but ${holders.join(", ")} still hold it`);
    }
    if (op === "checkpoint" && this.fake.calls.slice(calledBefore).some((c) => c.op === "prepare")) this.checkResumeFailures(request, outcome.reply);
    if (op === "restore") {
      // "On success everyone is restored (still paused) until resume"
      const open = this.engine.openCheckpoint;
      if (!open || open.checkpoint_id !== id || open.phase !== "restored") this.fail(`restore of ${id} succeeded, but the open checkpoint is ${JSON.stringify(open)}`);
      // Those that installed it now (the fake answers one it restored before from its reply cache, leaving its state as it is).
      const installed = this.fake.installs.slice(installsBefore).map((m) => m.replace("/", "."));
      const others = installed.filter((key) => this.fake.state.get(key)?.checkpoint_id !== id);
      if (others.length > 0) this.fail(`restore of ${id} succeeded, but ${others.join(", ")} do not hold it`);
    }
    if (op === "prepare" && (outcome.reply as { prepared: boolean }).prepared) {
      const open = this.engine.openCheckpoint;
      if (!open || open.checkpoint_id !== id || open.phase !== "prepared") this.fail(`prepare of ${id} succeeded, but the open checkpoint is ${JSON.stringify(open)}`);
    }
    if (op === "checkpoint" && request["stop"] && this.fake.calls.slice(calledBefore).some((c) => c.op === "commit")) {
      // "with stop: true there is no resume: participants stay parked because the controller stops"
      const released = FOUR.map((m) => `${m.kind}.${m.instance}`).filter((key) => this.fake.state.get(key)?.checkpoint_id !== id);
      if (released.length > 0) this.fail(`stop checkpoint ${id} succeeded, but ${released.join(", ")} do not hold it`);
    }
    // A commit of an id closed here since is answered from its kept reply ("a retry of a commit op that succeeded gets its reply instead").
    if (op === "commit" && (before.open as { checkpoint_id?: string } | null)?.checkpoint_id === id) {
      const open = this.engine.openCheckpoint;
      if (!open || open.checkpoint_id !== id || (open.phase !== "committed" && open.phase !== "published")) this.fail(`commit of ${id} succeeded, but the open checkpoint is ${JSON.stringify(open)}`);
    }
    if (op === "list") {
      // LATEST is among the listed checkpoints; retention (2 here) keeps no more than the newest two.
      const listed = outcome.reply as { latest: string | null; checkpoints: { checkpoint_id: string }[] };
      const latest = (await this.snapshot()).latest;
      if (listed.latest !== latest) this.fail(`list says LATEST is ${listed.latest}, the file ${latest}`);
      if (latest !== null && !listed.checkpoints.some((c) => c.checkpoint_id === latest)) this.fail(`list lacks LATEST ${latest}`);
      if (listed.checkpoints.length > 2) this.fail(`list shows ${listed.checkpoints.length} checkpoints, retention keeps 2`);
    }
    if (op === "status") {
      const shown = (outcome.reply as { checkpoint: unknown }).checkpoint;
      if (!isDeepStrictEqual(shown, this.engine.openCheckpoint)) this.fail(`status shows ${JSON.stringify(shown)} open, the engine ${JSON.stringify(this.engine.openCheckpoint)}`);
    }
    return outcome;
  }

  private call(op: CtlOp, request: Record<string, unknown>): Promise<unknown> {
    const engine = this.engine as unknown as Record<CtlOp, (r: Record<string, unknown>) => Promise<unknown>>;
    if (op === "status" || op === "list") return engine[op].call(this.engine, {});
    return engine[op].call(this.engine, request);
  }

  private async bounded(op: string, promise: Promise<unknown>): Promise<Outcome> {
    let timer: NodeJS.Timeout | undefined;
    const hang = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new InvariantViolation(`${op} still pending after ${HANG_MS} ms`)), HANG_MS)));
    try {
      return { ok: true, reply: await Promise.race([promise, hang]) };
    } catch (error) {
      if (error instanceof InvariantViolation) this.fail(error.message);
      return { ok: false, error };
    } finally {
      clearTimeout(timer);
    }
  }

  /** No step throws anything but a CheckpointError with a catalog code, and never internal_error (no fault injects one). */
  private checkThrown(op: string, outcome: Outcome): void {
    if (outcome.ok) return;
    const error = outcome.error;
    if (!(error instanceof CheckpointError)) this.fail(`${op} threw ${String((error as Error)?.stack ?? error)}`);
    if (!ERROR_CODES.includes(error.code)) this.fail(`${op} refused with ${error.code}, not a catalog code`);
    if (error.code === "internal_error") this.fail(`${op} answered internal_error: ${error.message}`);
  }

  /** After every step: LATEST names a published checkpoint and moves only on a publication; the open checkpoint is journaled. */
  private async checkAlways(before: Snapshot, op: string, outcome: Outcome): Promise<void> {
    const after = await this.snapshot();
    if (after.latest !== null && !existsSync(join(this.root, after.latest, "checkpoint.json"))) {
      this.fail(`LATEST names ${after.latest}, which has no checkpoint.json`);
    }
    if (after.latest !== null && after.latest !== before.latest) this.checkCommittedEverywhere("publication", after.latest);
    if (after.latest !== before.latest) {
      const publishes = (op === "publish" || op === "checkpoint") && outcome.ok && (outcome.reply as { checkpoint_id: string }).checkpoint_id === after.latest;
      if (!publishes && op !== "recover") this.fail(`LATEST moved from ${before.latest} to ${after.latest} on ${op} → ${describe(outcome)}`);
    }
    // "addresses that checkpoint's prepare, commit, renew and resume messages to it"; "its resume goes to that one [that restored] even while the view lags".
    // Addressed to the process the view shows, the holder is one the coordinator cannot know of yet (a lagging view, a restore it refused).
    const misaddressed = this.fake.misaddressed.splice(0).filter((m) => m.addressed !== this.view.get(m.participant));
    if (misaddressed.length > 0) this.fail(`guarded messages addressed to another process than the one holding their checkpoint: ${misaddressed.map((m) => m.detail).join("; ")}`);
    if (this.journal.entries.size > 1) this.fail(`the journal holds ${[...this.journal.entries.keys()].join(", ")}: more than one checkpoint open`);
    const open = this.engine.openCheckpoint;
    if (open && !this.journal.entries.has(open.checkpoint_id)) {
      this.fail(`${open.checkpoint_id} is open (${open.phase}) but not journaled (journal: ${[...this.journal.entries.keys()].join(", ") || "empty"})`);
    }
  }

  /**
   * docs/api.md "Deadlines": a request still unanswered at the deadline is outcome_unknown, and a
   * failing op answers "inside the clients' default 10 s wait" past its deadline_ts (the default
   * timeout from its arrival when it names none), stalled participants (timeout, late) included.
   * By design later: "a checkpoint's resume and publication, a restore's clean-up" (and the
   * restored checkpoint's resume, which may run that clean-up).
   */
  private checkAnsweredInTime(op: CtlOp, request: Record<string, unknown>, before: Snapshot, calledBefore: number, startedAt: number, answeredAt: number): void {
    if (op === "restore" || op === "publish" || op === "status" || op === "list" || op === "get") return;
    const sent = this.fake.calls.slice(calledBefore);
    if (op === "checkpoint" && sent.some((c) => c.op === "commit")) return;
    const open = before.open as { checkpoint_id?: string; phase?: string } | null;
    if (op === "resume" && open?.checkpoint_id === request["checkpoint_id"] && open?.phase === "restored") return;
    const deadlineTs = request["deadline_ts"] as number | undefined;
    const deadlineMs = deadlineTs === undefined ? startedAt + DEFAULT_TIMEOUT_MS : Math.max(deadlineTs * 1000, startedAt);
    if (answeredAt > deadlineMs + DEFAULT_REPLY_SLACK_MS) {
      this.fail(`${op} answered ${answeredAt - deadlineMs} ms past its deadline, beyond the clients' ${DEFAULT_REPLY_SLACK_MS} ms wait (sent: ${sent.map((c) => `${c.op}:${c.kind}/${c.instance}`).join(", ")})`);
    }
  }

  /**
   * A resume that ran closes the checkpoint "even if some fail", and a restore's clean-up resumes
   * everyone ("never left parked"): afterwards it is held only where a resume is scripted to fail.
   * Not a retry answered from memory (nothing sent): one the earlier resume failed at resumes by its lease.
   */
  private checkResumedEverywhere(request: Record<string, unknown>, outcome: Outcome, calledBefore: number): void {
    const id = request["checkpoint_id"] as string;
    const error = outcome.ok ? undefined : (outcome.error as CheckpointError);
    const ran = !error || error.code === "restore_failed" || error.message.startsWith("resume failed on ");
    if (!ran || !this.fake.calls.slice(calledBefore).some((c) => c.op === "resume")) return;
    const failing = (key: string) => {
      const fault = this.fake.script.get(`${key}.resume`);
      return fault !== undefined && fault !== "late";
    };
    const holders = [...this.fake.state].filter(([key, s]) => s.checkpoint_id === id && !failing(key)).map(([key, s]) => `${key} (${s.phase})`);
    if (holders.length > 0) this.fail(`resume of ${id} answered ${describe(outcome)}, but ${holders.join(", ")} still hold it (no resume fault scripted there)`);
  }

  /**
   * The participants' refusals of a restore sent now (a participant's resumed fence, its live state,
   * scripted): docs/api.md "restore". Every participant refused it with a code that promises nothing
   * was installed (RESTORE_REFUSALS), none parked in another checkpoint (invalid_phase,
   * checkpoint_conflict): that refusal is the answer (their common code, else one of theirs), nothing
   * retired or resumed, the journal and the open checkpoint as they were. Otherwise, failed: the
   * clean-up retires attempt+1 at every participant that installed it now and at none that refused
   * it so ("a refusal changes nothing"), and resumes everyone.
   */
  private async checkRestoreRefusals(before: Snapshot, outcome: Outcome, calledBefore: number, installsBefore: number): Promise<void> {
    const sent = this.fake.calls.slice(calledBefore);
    const restores = sent.filter((c) => c.op === "restore");
    if (restores.length === 0) return;
    const refused = new Set(restores.filter((c) => RESTORE_REFUSALS.has(c.answered as never)).map((c) => `${c.kind}.${c.instance}`));
    const codes = restores.map((c) => c.answered!);
    const id = restores[0]!.body["checkpoint_id"] as string;
    const everywhere = FOUR.every((m) => refused.has(`${m.kind}.${m.instance}`)) && codes.every((c) => !PARKED_ELSEWHERE.has(c));
    if (everywhere) {
      const code = outcome.ok ? "ok" : (outcome.error as CheckpointError).code;
      const common = new Set(codes).size === 1 ? codes[0]! : undefined;
      if (common !== undefined ? code !== common : !codes.includes(code)) this.fail(`restore of ${id} refused by every participant (${codes.join(", ")}) answered ${describe(outcome)}`);
      const cleanup = sent.filter((c) => c.op === "retire" || c.op === "resume");
      if (cleanup.length > 0) this.fail(`restore of ${id} refused by every participant (${codes.join(", ")}), yet ${cleanup.map((c) => `${c.op}:${c.kind}/${c.instance}`).join(", ")} sent`);
      if (this.changedBesidesStaleClose(before, await this.snapshot())) this.fail(`restore of ${id} refused by every participant (${codes.join(", ")}) changed the journal or the open checkpoint`);
      return;
    }
    if (outcome.ok || (outcome.error as CheckpointError).code !== "restore_failed") return;
    const retired = new Set(sent.filter((c) => c.op === "retire" && c.body["checkpoint_id"] === id).map((c) => `${c.kind}.${c.instance}`));
    const installed = this.fake.installs.slice(installsBefore).map((m) => m.replace("/", "."));
    const unretired = installed.filter((key) => !retired.has(key));
    if (unretired.length > 0) this.fail(`restore of ${id} failed, but attempt+1 was not retired at ${unretired.join(", ")}, which installed it`);
    const fenced = [...refused].filter((key) => retired.has(key));
    if (fenced.length > 0) this.fail(`restore of ${id} failed, and attempt+1 was retired at ${fenced.join(", ")}, which refused it (${codes.join(", ")})`);
    // "resumes everyone": also a process still parked in that (stop) checkpoint, which refused it (invalid_phase).
    // Not one the coordinator cannot know of: restarted, the view lagging, its restore's reply (naming it) lost; its lease resumes it.
    const failing = (key: string) => this.fake.script.has(`${key}.resume`) && this.fake.script.get(`${key}.resume`) !== "late";
    const unknown = (key: string) => this.lagging.has(key) && restores.some((c) => `${c.kind}.${c.instance}` === key && c.answered !== "ok");
    const holders = [...this.fake.state].filter(([key, st]) => st.checkpoint_id === id && !failing(key) && !unknown(key)).map(([key, st]) => `${key} (${st.phase})`);
    if (holders.length > 0) this.fail(`restore of ${id} failed and was cleaned up, but ${holders.join(", ")} still hold it (no resume fault scripted there)`);
  }

  /**
   * Whether the journal or the open checkpoint differ from `before`, but for the close of an open
   * published or restored checkpoint no member holds any more, which a restore does first ("closed
   * without a message when the next prepare, retire, forget or restore finds so") and then goes ahead.
   * The journal's restore outcome records too: that close records a restored checkpoint's outcome,
   * a published one's leaves none; nothing else changes one (a restore every participant refused
   * writes back the record it took the place of).
   */
  private changedBesidesStaleClose(before: Snapshot, after: Snapshot): boolean {
    if (after.journal === before.journal && after.outcomes === before.outcomes && isDeepStrictEqual(after.open, before.open)) return false;
    const open = before.open as { checkpoint_id: string; phase: string } | null;
    if (!open || after.open !== null || !["published", "restored"].includes(open.phase)) return true;
    if ([...this.fake.state.values()].some((s) => s.checkpoint_id === open.checkpoint_id)) return true;
    const entries = (JSON.parse(before.journal) as [string, unknown][]).filter(([id]) => id !== open.checkpoint_id);
    // Restored: "restored", or "restore_failed" when a holder restarted before its resume (lost what it restored).
    const closedRecord = new Map(JSON.parse(after.outcomes) as [string, string][]).get(open.checkpoint_id);
    const outcomes = new Map(JSON.parse(before.outcomes) as [string, string][]);
    if (open.phase === "restored" && (closedRecord === "restored" || closedRecord === "restore_failed")) outcomes.set(open.checkpoint_id, closedRecord);
    else outcomes.delete(open.checkpoint_id);
    const expected = JSON.stringify([...outcomes].sort(([a], [b]) => a.localeCompare(b)));
    return JSON.stringify(entries) !== after.journal || expected !== after.outcomes;
  }

  /**
   * docs/protocol.md "retire, forget: environment → agent → (model ∥ resources); stop at the first
   * stage with a failure", and the participants' phase rules (control-plane admitOutsideCheckpoint).
   * Refused by the coordinator while a checkpoint other than a restored one stays open (nothing
   * sent); done: every member answered it, a stage only after the one before had answered, and
   * every member now fences what was retired (data plane: stale_attempt) or accepts attempt 0 of
   * what was forgotten again; failed at a stage: nothing sent past it. Neither changes the journal
   * or the open checkpoint (but the close of one nobody holds).
   */
  private async checkRetireForget(op: "retire" | "forget", request: Record<string, unknown>, before: Snapshot, outcome: Outcome, calledBefore: number): Promise<void> {
    const sent = this.fake.calls.slice(calledBefore).filter((c) => c.op === op);
    const stageOf = (kind: Kind) => RETIRE_STAGES.findIndex((stage) => stage.includes(kind));
    const open = before.open as { checkpoint_id: string; phase: string } | null;
    const stillOpen = this.engine.openCheckpoint?.checkpoint_id === open?.checkpoint_id;
    if (open && open.phase !== "restored" && stillOpen) {
      const code = outcome.ok ? "ok" : (outcome.error as CheckpointError).code;
      // invalid_phase, unless refused before for its request (a deadline past or too far ahead).
      if (!NOTHING_CHANGED[op]!.has(code) || sent.length > 0) this.fail(`${op} while ${open.checkpoint_id} is open (${open.phase}) answered ${describe(outcome)} and sent ${sent.length} message(s), not invalid_phase with none`);
    }
    if (this.changedBesidesStaleClose(before, await this.snapshot())) this.fail(`${op} changed the journal or the open checkpoint: ${describe(outcome)}`);
    for (const a of sent) {
      for (const b of sent) {
        if (stageOf(b.kind) > stageOf(a.kind) && (a.answeredSeq === undefined || b.seq < a.answeredSeq)) {
          this.fail(`${op} sent to ${b.kind}/${b.instance} before ${a.kind}/${a.instance} (an earlier stage) had answered`);
        }
      }
    }
    if (outcome.ok) {
      const unreached = FOUR.filter((m) => !sent.some((c) => c.kind === m.kind && c.instance === m.instance && c.answered === "ok")).map((m) => `${m.kind}/${m.instance}`);
      if (unreached.length > 0) this.fail(`${op} answered ok, but ${unreached.join(", ")} never answered it ok (sent: ${sent.map((c) => `${c.kind}/${c.instance}:${c.answered}`).join(", ")})`);
      for (const m of FOUR) {
        const memory = this.fake.memoryOf(`${m.kind}.${m.instance}`);
        if (op === "retire") {
          const unfenced = (request["episode_ids"] as EpisodeId[]).filter((e) => !memory.retiredAttempt(e)).map(captureKey);
          if (unfenced.length > 0) this.fail(`retire answered ok, but ${m.kind}/${m.instance} still admits ${unfenced.join(", ")}`);
        } else {
          const fenced = (request["rollout_ids"] as string[]).filter((r) => memory.fencedAttempt({ rollout_id: r, attempt: 0 }));
          if (fenced.length > 0) this.fail(`forget answered ok, but ${m.kind}/${m.instance} still refuses attempt 0 of ${fenced.join(", ")} (stale_attempt)`);
        }
      }
      return;
    }
    const failedStages = sent.filter((c) => c.answered !== "ok").map((c) => stageOf(c.kind));
    if (failedStages.length === 0) return;
    const stoppedAt = Math.min(...failedStages);
    const past = sent.filter((c) => stageOf(c.kind) > stoppedAt).map((c) => `${c.kind}/${c.instance}`);
    if (past.length > 0) this.fail(`${op} failed at stage ${RETIRE_STAGES[stoppedAt]!.join("+")}, yet was sent on to ${past.join(", ")}`);
  }

  /**
   * A participant that refused a phase message for its deadline (or whose hook ran past it) did not
   * do it: the controller op that stands on it never answers success (a prepare: prepared).
   */
  private checkDeadlineRefusals(op: CtlOp, outcome: Outcome, calledBefore: number): void {
    if (!outcome.ok) return;
    if (op === "prepare" && !(outcome.reply as { prepared: boolean }).prepared) return;
    const phases = PHASE_MESSAGES[op];
    if (!phases) return;
    const refused = this.fake.calls.slice(calledBefore).filter((c) => phases.includes(c.op) && c.answered === "deadline_exceeded");
    if (refused.length > 0) this.fail(`${op} answered ${describe(outcome)}, but ${refused.map((c) => `${c.op}:${c.kind}/${c.instance}`).join(", ")} refused it for its deadline`);
  }

  /**
   * docs/protocol.md: a restore "past its deadline" or whose install outlived it answers
   * deadline_exceeded, which says attempt+1 may be installed there: the restore fails and goes the
   * all-or-nothing clean-up path: attempt+1 retired there (and wherever it may be installed), everyone resumed.
   */
  private checkTimedOutRestore(outcome: Outcome, calledBefore: number): void {
    const sent = this.fake.calls.slice(calledBefore);
    const late = sent.filter((c) => c.op === "restore" && c.answered === "deadline_exceeded");
    if (late.length === 0) return;
    const code = outcome.ok ? "ok" : (outcome.error as CheckpointError).code;
    if (code !== "restore_failed") this.fail(`restore refused for its deadline at ${late.map((c) => `${c.kind}/${c.instance}`).join(", ")} answered ${describe(outcome)}, not restore_failed`);
    const next = ((late[0]!.body["episode_ids"] as EpisodeId[]) ?? []).map((e) => captureKey(nextAttempt(e))).sort();
    for (const c of late) {
      const retired = sent.some((r) => r.op === "retire" && r.kind === c.kind && r.instance === c.instance && r.seq > c.seq && isDeepStrictEqual((r.body["episode_ids"] as EpisodeId[]).map(captureKey).sort(), next));
      if (!retired) this.fail(`restore refused at ${c.kind}/${c.instance} for its deadline (it may have installed), but attempt+1 (${next.join(", ")}) was not retired there`);
    }
  }

  /** Attempts the coordinator's own restore clean-up retired, per participant (a controller's retire not counted). */
  private noteCleanupRetires(op: CtlOp | "recover", calledBefore: number): void {
    for (const c of this.fake.calls.slice(calledBefore)) {
      const key = `${c.kind}.${c.instance}`;
      // A forget done there lifts them (a later controller's retire of the same attempt is its own).
      if (c.op === "forget" && c.answered === "ok") {
        const set = this.cleanupRetired.get(key);
        for (const rollout of c.body["rollout_ids"] as string[]) for (const k of [...(set ?? [])]) if (k === rollout || k.startsWith(`${rollout}-a`)) set!.delete(k);
      }
      if (c.op !== "retire" || op === "retire") continue;
      const set = this.cleanupRetired.get(key) ?? new Set<string>();
      for (const e of c.body["episode_ids"] as EpisodeId[]) set.add(captureKey(e));
      this.cleanupRetired.set(key, set);
    }
  }

  /**
   * Nothing retired is continued later: a restore answered ok (sent now or answered from the open
   * one), or the resume of a restored checkpoint answered ok, tells the controller to run attempt+1
   * of its scope; none may be an attempt a restore clean-up retired at a participant that still
   * fences it (not forgotten since, the same process).
   */
  private checkNothingRetiredContinues(op: CtlOp, request: Record<string, unknown>, before: Snapshot, outcome: Outcome): void {
    if (!outcome.ok) return;
    let id: string | undefined;
    let scope: EpisodeId[] | null | undefined;
    if (op === "restore") {
      id = (outcome.reply as { checkpoint_id: string }).checkpoint_id;
      scope = this.journal.entries.get(id)?.scope ?? (request["episode_ids"] as EpisodeId[]);
    } else if (op === "resume") {
      const open = before.open as { checkpoint_id: string; phase: string } | null;
      if (open?.phase !== "restored" || open.checkpoint_id !== request["checkpoint_id"]) return;
      id = open.checkpoint_id;
      scope = this.restoredScopes.get(id);
    }
    if (id === undefined || !scope) return;
    if (op === "restore") this.restoredScopes.set(id, scope);
    for (const m of FOUR) {
      const key = `${m.kind}.${m.instance}`;
      const memory = this.fake.memoryOf(key);
      const retired = scope.map(nextAttempt).filter((e) => this.cleanupRetired.get(key)?.has(captureKey(e)) && memory.retiredAttempt(e));
      if (retired.length > 0) this.fail(`${op} of restored ${id} answered ok, but its clean-up retired ${retired.map(captureKey).join(", ")} at ${key}, which still fences it`);
    }
  }

  /** A commit or checkpoint op that succeeded was committed (its files written) by every participant, not answered by one that had resumed it unwritten. */
  private checkCommittedEverywhere(op: string, id: string): void {
    const missing = FOUR.map((m) => `${m.kind}.${m.instance}`).filter((key) => !this.fake.committed.has(`${key}.${id}`));
    if (missing.length > 0) this.fail(`${op} of ${id} succeeded, but ${missing.join(", ")} never committed it`);
  }

  /** docs/api.md: "a refused request changes nothing". */
  private async checkNothingChanged(before: Snapshot, op: string, code: string): Promise<void> {
    const after = await this.snapshot();
    const changed: string[] = [];
    // Not the close of a published or restored checkpoint nobody holds any more, which an op that finds so makes first ("closed without a message").
    const staleClose = !this.changedBesidesStaleClose(before, after);
    if (!staleClose && !isDeepStrictEqual(after.open, before.open)) changed.push(`open ${JSON.stringify(before.open)} → ${JSON.stringify(after.open)}`);
    if (!staleClose && after.journal !== before.journal) changed.push(`journal ${before.journal} → ${after.journal}`);
    if (!staleClose && after.outcomes !== before.outcomes) changed.push(`restore outcome records ${before.outcomes} → ${after.outcomes}`);
    if (after.latest !== before.latest) changed.push(`LATEST ${before.latest} → ${after.latest}`);
    if (after.phaseCalls !== before.phaseCalls) {
      const sent = this.fake.calls.filter((c) => c.op !== "status").slice(before.phaseCalls).map((c) => `${c.op}:${c.kind}/${c.instance}`);
      changed.push(`sent ${sent.join(", ")}`);
    }
    if (changed.length > 0) this.fail(`${op} refused with ${code}, which promises nothing changed, but: ${changed.join("; ")}`);
  }

  /** A checkpoint's reply lists resume_failures exactly for the participants whose resume failed. */
  private checkResumeFailures(request: Record<string, unknown>, reply: unknown): void {
    const listed = (reply as { resume_failures: { kind: string; instance: string }[] }).resume_failures.map((f) => `${f.kind}.${f.instance}`).sort();
    const failing = request["stop"] ? [] : FOUR.map((m) => `${m.kind}.${m.instance}`).filter((key) => this.fake.script.has(`${key}.resume`)).sort();
    if (!isDeepStrictEqual(listed, failing)) this.fail(`checkpoint listed resume_failures [${listed.join(", ")}], but the resume failed at [${failing.join(", ")}]`);
    const id = (reply as { checkpoint_id: string }).checkpoint_id;
    const holders = [...this.fake.state].filter(([key, s]) => s.checkpoint_id === id && !listed.includes(key)).map(([key]) => key);
    if (!request["stop"] && holders.length > 0) this.fail(`checkpoint ${id} succeeded, but ${holders.join(", ")} still hold it and are not among its resume_failures`);
  }

  private async snapshot(): Promise<Snapshot> {
    let latest: string | null;
    try {
      latest = await this.fixture.catalog.latest();
    } catch (error) {
      this.fail(`LATEST unreadable: ${String(error)}`);
    }
    return {
      open: this.engine.openCheckpoint,
      journal: JSON.stringify([...this.journal.entries].sort(([a], [b]) => a.localeCompare(b))),
      outcomes: JSON.stringify([...this.journal.outcomes].sort(([a], [b]) => a.localeCompare(b))),
      latest,
      phaseCalls: this.fake.calls.filter((c) => c.op !== "status").length,
    };
  }

  /** Lets background work (LATEST's fsync, then the journal entry's removal; retention's deletions) finish. */
  private async settle(): Promise<void> {
    for (let i = 0; i < 3; i++) {
      await this.fixture.writer.settled();
      await new Promise((resolve) => setImmediate(resolve));
    }
  }

  private fail(message: string): never {
    throw new InvariantViolation(message);
  }
}

/** A restore's answer that every participant refused it (RESTORE_REFUSALS, none parked elsewhere): their refusal, naming them. */
function refusedByEveryParticipant(error: CheckpointError): boolean {
  return RESTORE_REFUSALS.has(error.code) && !PARKED_ELSEWHERE.has(error.code) && error.message.startsWith(participantFailurePrefix("restore"));
}

function describe(outcome: Outcome): string {
  if (outcome.ok) return `ok ${JSON.stringify(outcome.reply).slice(0, 300)}`;
  const error = outcome.error as { code?: string; message?: string };
  return `${error.code ?? "thrown"}: ${String(error.message).slice(0, 300)}`;
}

/** What identifies a publication in a checkpoint or publish reply (deleted, resume_failures and timings are this coordinator's). */
function publication(reply: unknown): unknown {
  const { checkpoint_id, checkpoint_dir, manifest_path, published_at } = reply as Record<string, unknown>;
  return { checkpoint_id, checkpoint_dir, manifest_path, published_at };
}
