import { afterEach, describe, expect, it, vi } from "vitest";
import { CohortTable, DEFAULT_COHORT_SETTINGS } from "../../../participants/verifiers/cohort-table.js";

/**
 * docs/verifiers.md: finished cohorts are kept for `resultTtlMs` (1 h) for replays. That is a
 * duration: a wall-clock step forward (NTP, a resumed VM) must not drop a result just judged, or a
 * member replaying its /verify (a lost reply, a restored rollout) opens the cohort afresh and waits
 * for members that never come, until the collection timeout (30 min) fails it.
 */
afterEach(() => {
  vi.useRealTimers();
});

const coordinates = (index: number) => ({ groupId: "g1", attempt: 0, index });
const member = (index: number, answer: string) => ({ index, answer, task: {} });

describe("CohortTable: a finished cohort's results across a wall-clock step", () => {
  it("a replay after the wall clock stepped 2 h forward gets the kept result, not a fresh cohort", async () => {
    vi.useFakeTimers({ toFake: ["Date"] }); // the wall clock alone; timers and performance.now() stay real
    const table = new CohortTable({ ...DEFAULT_COHORT_SETTINGS, size: 2 }, async (members) => members.map((m) => m.index));
    expect(await Promise.all([table.arrive(coordinates(0), "d0", member(0, "a")), table.arrive(coordinates(1), "d1", member(1, "b"))])).toEqual([{ reward: 0 }, { reward: 1 }]);
    vi.setSystemTime(Date.now() + 2 * 3_600_000);
    const stop = new AbortController();
    const replay = table.arrive(coordinates(0), "d0", member(0, "a"), stop.signal);
    const reopened = table.activeCohorts;
    if (reopened) {
      replay.catch(() => undefined);
      stop.abort(new Error("the replay opened a fresh cohort"));
    }
    expect(reopened).toBe(0);
    await expect(replay).resolves.toEqual({ reward: 0 });
    expect(table.judgeCalls).toBe(1);
  });
});
