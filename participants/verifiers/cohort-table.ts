import { MAX_TIMER_MS, canonicalDigest } from "../../protocol/index.js";
import { VerifierError } from "./verifier-errors.js";
import type { VerifyResult } from "./verifier-server.js";

/** One member's submission, as the judge sees it. */
export interface CohortMember {
  index: number;
  answer: string;
  task: unknown;
}

/** Judges a complete cohort: one result per member, in index order. */
export type CohortJudge = (members: CohortMember[], signal: AbortSignal) => Promise<number[]>;

export interface CohortSettings {
  /** Members per cohort (num_rollouts_per_prompt). */
  size: number;
  /** From the first member's arrival; duplicates do not extend it. */
  collectionTimeoutMs: number;
  /** Covers the judge call(s) after collection. */
  evaluationTimeoutMs: number;
  /** How long finished cohorts (results or failures) are kept for replays. */
  resultTtlMs: number;
  /** Count cap on finished cohorts kept. */
  maxTerminalCohorts: number;
  /** Count cap on cohorts collecting or being judged; a new cohort beyond it is refused. */
  maxActiveCohorts: number;
}


export const DEFAULT_COHORT_SETTINGS: Omit<CohortSettings, "size"> = {
  collectionTimeoutMs: 1_800_000,
  evaluationTimeoutMs: 1_800_000,
  resultTtlMs: 3_600_000,
  maxTerminalCohorts: 4096,
  maxActiveCohorts: 1024,
};

export interface Coordinates {
  groupId: string;
  attempt: number;
  index: number;
}

interface Slot {
  digest: string;
  member: CohortMember | undefined;
  /** Requests waiting on this slot (the first arrival and identical replays). */
  waiters: number;
}

type CohortState = "collecting" | "judging" | "done" | "failed" | "superseded";

interface Cohort {
  groupId: string;
  attempt: number;
  state: CohortState;
  /** The member is only needed until judging starts; replays compare the digest. */
  slots: Map<number, Slot>;
  /** Canonical digest of the task every member shares (the judge sees one task). */
  taskDigest: string;
  results: VerifyResult[] | undefined;
  failure: VerifierError | undefined;
  settled: Promise<void>;
  settle: () => void;
  timer: NodeJS.Timeout | undefined;
  /** Aborts the judge call while the cohort is judged (a newer attempt superseding it stops the call). */
  judging: AbortController | undefined;
  /** performance.now() at the finish (the TTL is a duration). */
  finishedAt: number | undefined;
}

/**
 * Process-local cohort table of the comparison verifier. A cohort is keyed by group id and
 * group attempt; each member owns one slot. Judging starts once every slot is filled and all
 * results are published together. Nothing here is durable: after a crash the table is empty
 * and cohorts are rebuilt only from the members that re-send their `/verify` (docs/verifiers.md).
 */
export class CohortTable {
  private readonly cohorts = new Map<string, Cohort>();
  /** Finished cohorts in finish order, for the TTL and count caps. */
  private readonly finished: Cohort[] = [];
  private active = 0;
  judgeCalls = 0;

  constructor(
    private readonly settings: CohortSettings,
    private readonly judge: CohortJudge,
  ) {
    for (const [name, value] of Object.entries(settings)) {
      if (!Number.isFinite(value) || value <= 0) throw new Error(`cohort setting ${name} must be finite and positive`);
    }
    if (!Number.isInteger(settings.size)) throw new Error("cohort size must be an integer");
    // setTimeout fires a longer delay at once (after 1 ms): every cohort would fail, or every judge call time out.
    for (const name of ["collectionTimeoutMs", "evaluationTimeoutMs"] as const) {
      if (settings[name] > MAX_TIMER_MS) throw new Error(`cohort setting ${name} must be at most ${MAX_TIMER_MS} ms`);
    }
  }

  /** Cohorts collecting or being judged (for status and tests). */
  get activeCohorts(): number {
    return this.active;
  }

  /**
   * Takes (or rejoins) the member's slot and waits for the cohort's result. `signal` aborting (its
   * request's attempt was retired) ends the wait with its reason; a slot nobody waits on any more
   * is then given up while the cohort still collects, so the retried member can take it.
   */
  async arrive(coordinates: Coordinates, digest: string, member: CohortMember, signal?: AbortSignal): Promise<VerifyResult> {
    signal?.throwIfAborted();
    this.sweep(performance.now());
    if (coordinates.index < 0 || coordinates.index >= this.settings.size) {
      throw new VerifierError("invalid_coordinates", `_ng_rollout_index must be in 0..${this.settings.size - 1}`);
    }
    let cohort = this.cohorts.get(coordinates.groupId);
    if (cohort && coordinates.attempt < cohort.attempt) {
      throw new VerifierError("cohort_superseded", `group attempt ${coordinates.attempt} was superseded by ${cohort.attempt}`);
    }
    // Checked before anything changes; a newer attempt replacing an active one adds no cohort.
    const opens = !cohort || coordinates.attempt > cohort.attempt;
    const replacesActive = cohort !== undefined && (cohort.state === "collecting" || cohort.state === "judging");
    if (opens && !replacesActive && this.active >= this.settings.maxActiveCohorts) {
      throw new VerifierError("cohort_capacity", `${this.active} cohorts are already collecting or being judged (maxActiveCohorts)`);
    }
    if (cohort && coordinates.attempt > cohort.attempt) {
      this.supersede(cohort);
      cohort = undefined;
    }
    const taskDigest = canonicalDigest(member.task);
    if (!cohort) cohort = this.create(coordinates, taskDigest);

    let slot = cohort.slots.get(coordinates.index);
    if (slot) {
      // Identical replay: wait with the others, or take the cached result without judging again.
      if (slot.digest !== digest) throw new VerifierError("cohort_slot_conflict", `slot ${coordinates.index} holds a different payload`);
    } else {
      if (cohort.state !== "collecting") throw cohort.failure ?? new VerifierError("cohort_failed", "the cohort is no longer collecting");
      // The judge compares the responses to one task: a member with another would be judged against the wrong one.
      if (taskDigest !== cohort.taskDigest) throw new VerifierError("cohort_task_conflict", `member ${coordinates.index}'s task differs from its cohort's`);
      slot = { digest, member, waiters: 0 };
      cohort.slots.set(coordinates.index, slot);
      if (cohort.slots.size === this.settings.size) this.startJudging(cohort);
    }
    if (!(await this.waitSettled(cohort, slot, coordinates.index, signal))) throw signal!.reason;
    if (cohort.state === "done") return cohort.results![coordinates.index]!;
    throw cohort.failure ?? new VerifierError("cohort_failed", "the cohort failed");
  }

  /** False when `signal` aborted first (the slot is given up if nobody else waits on it). */
  private async waitSettled(cohort: Cohort, slot: Slot, index: number, signal: AbortSignal | undefined): Promise<boolean> {
    slot.waiters += 1;
    if (!signal) {
      await cohort.settled;
      return true;
    }
    let onAbort!: () => void;
    const aborted = new Promise<false>((resolve) => {
      onAbort = () => resolve(false);
      signal.addEventListener("abort", onAbort, { once: true });
    });
    try {
      const settled = await Promise.race([cohort.settled.then(() => true as const), aborted]);
      if (!settled && --slot.waiters === 0 && cohort.state === "collecting" && cohort.slots.get(index) === slot) {
        cohort.slots.delete(index);
        // Every member left (retired): nobody waits, so it stops counting against maxActiveCohorts
        // now rather than at its collection timeout; a member arriving later opens it afresh.
        if (cohort.slots.size === 0) this.abandon(cohort);
      }
      return settled;
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  }

  private create(coordinates: Coordinates, taskDigest: string): Cohort {
    let settle!: () => void;
    const settled = new Promise<void>((resolve) => (settle = resolve));
    const cohort: Cohort = {
      groupId: coordinates.groupId,
      attempt: coordinates.attempt,
      state: "collecting",
      slots: new Map(),
      taskDigest,
      results: undefined,
      failure: undefined,
      settled,
      settle,
      timer: undefined,
      judging: undefined,
      finishedAt: undefined,
    };
    cohort.timer = setTimeout(() => {
      if (cohort.state !== "collecting") return;
      this.finish(
        cohort,
        "failed",
        new VerifierError("cohort_failed", `only ${cohort.slots.size} of ${this.settings.size} members arrived within ${this.settings.collectionTimeoutMs} ms`),
      );
    }, this.settings.collectionTimeoutMs);
    cohort.timer.unref?.();
    this.cohorts.set(coordinates.groupId, cohort);
    this.active += 1;
    return cohort;
  }

  private startJudging(cohort: Cohort): void {
    clearTimeout(cohort.timer);
    cohort.state = "judging";
    const members = [...cohort.slots.values()].map((s) => s.member!).sort((a, b) => a.index - b.index);
    // The judge has them now; a finished cohort is kept (up to resultTtlMs) only for its digests and results.
    for (const slot of cohort.slots.values()) slot.member = undefined;
    const abort = new AbortController();
    cohort.judging = abort;
    const timer = setTimeout(() => abort.abort(new Error("evaluation timeout")), this.settings.evaluationTimeoutMs);
    timer.unref?.();
    this.judgeCalls += 1;
    const judged = new Promise<number[]>((resolve, reject) => {
      abort.signal.addEventListener("abort", () => reject(new Error(`evaluation exceeded ${this.settings.evaluationTimeoutMs} ms`)), { once: true });
      this.judge(members, abort.signal).then(resolve, reject);
    });
    judged
      .then((rewards) => {
        if (rewards.length !== members.length || rewards.some((r) => typeof r !== "number" || !Number.isFinite(r))) {
          throw new Error("the judge returned a malformed result");
        }
        return rewards.map((reward): VerifyResult => ({ reward }));
      })
      .catch((error: unknown) =>
        // A judge failure is a masked result (HTTP 200), cached like any other.
        members.map((): VerifyResult => ({ reward: 0, _ng_failure_class: "judge_failed", detail: error instanceof Error ? error.message : String(error) })),
      )
      .then((results) => {
        clearTimeout(timer);
        cohort.judging = undefined;
        if (cohort.state !== "judging") return;
        cohort.results = results;
        this.finish(cohort, "done", undefined);
      });
  }

  private abandon(cohort: Cohort): void {
    clearTimeout(cohort.timer);
    this.active -= 1;
    cohort.state = "superseded";
    cohort.settle();
    if (this.cohorts.get(cohort.groupId) === cohort) this.cohorts.delete(cohort.groupId);
  }

  private supersede(cohort: Cohort): void {
    if (cohort.state === "collecting" || cohort.state === "judging") {
      // Nobody reads its result any more: a judge call left running would keep every member's
      // answer (and a judge request) for up to evaluationTimeoutMs, beyond maxActiveCohorts.
      cohort.judging?.abort(new Error(`group attempt ${cohort.attempt} was superseded`));
      this.finish(cohort, "superseded", new VerifierError("cohort_superseded", `group attempt ${cohort.attempt} was superseded`));
    }
    this.cohorts.delete(cohort.groupId);
  }

  private finish(cohort: Cohort, state: "done" | "failed" | "superseded", failure: VerifierError | undefined): void {
    clearTimeout(cohort.timer);
    this.active -= 1;
    cohort.state = state;
    cohort.failure = failure;
    cohort.finishedAt = performance.now(); // monotonic: a wall-clock step must not expire a result early
    if (state !== "superseded") this.finished.push(cohort);
    cohort.settle();
    this.sweep(cohort.finishedAt);
  }

  /** Drops finished cohorts past their TTL or beyond the count cap (oldest first). */
  private sweep(now: number): void {
    while (this.finished.length > 0) {
      const oldest = this.finished[0]!;
      const expired = now - oldest.finishedAt! > this.settings.resultTtlMs;
      if (!expired && this.finished.length <= this.settings.maxTerminalCohorts) break;
      this.finished.shift();
      if (this.cohorts.get(oldest.groupId) === oldest) this.cohorts.delete(oldest.groupId);
    }
  }
}
