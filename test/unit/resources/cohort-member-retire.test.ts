import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointError } from "../../../protocol/index.js";
import { CohortCompareVerifier } from "../../../participants/verifiers/cohort-compare-verifier.js";
import { CohortTable, DEFAULT_COHORT_SETTINGS } from "../../../participants/verifiers/cohort-table.js";
import { resourcesWorld } from "./resources-world.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * docs/verifiers.md: "Because /verify is replayable, a member waiting for its cohort never holds up
 * a prepare, so replaying /verify cannot deadlock a checkpoint." A retire waits for replayable
 * requests too: a member waiting in its cohort must leave the wait when its attempt is retired, or
 * the retire misses its deadline and the session stays `retiring`, a blocker of every prepare until
 * the cohort's collection timeout (30 min by default).
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

describe("cohort verifier: retiring a member that waits in its cohort", () => {
  it("ends its wait (stale_attempt), so the retire and later prepares go through before the collection timeout", async () => {
    const judged: string[][] = [];
    const verifier = new CohortCompareVerifier({ size: 2, collectionTimeoutMs: 60_000 }, async (members) => {
      judged.push(members.map((m) => m.answer));
      return members.map(() => 1);
    });
    const a = await world.harness(verifier);
    const seed = await a.post("/ng-rollout/r1/seed_session", {});
    const cookie = String(seed.headers["set-cookie"]).split(";")[0]!;
    const waiting = a.post("/ng-rollout/r1/verify", { task: {}, answer: "x", _ng_group_id: "g1", _ng_rollout_index: 0 }, cookie);
    await waitUntil(() => verifier.table.activeCohorts === 1, "the member waiting in its cohort");

    const retired = await a.call("retire", { checkpoint_id: "x1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] } as never, 1);
    expect(retired).toEqual({ retired: ["r1"] });
    expect((await waiting).json().error.code).toBe("stale_attempt");
    const prepared = await a.call("prepare", { checkpoint_id: "c1" }, 1);
    expect(prepared.phase).toBe("prepared");
    await a.call("resume", { checkpoint_id: "c1" });

    // The retired member's slot was given up: its retried attempt takes it with another answer.
    const retried = await a.post("/ng-rollout/r1-a1/seed_session", {});
    const retriedCookie = String(retried.headers["set-cookie"]).split(";")[0]!;
    const seed2 = await a.post("/ng-rollout/r2/seed_session", {});
    const cookie2 = String(seed2.headers["set-cookie"]).split(";")[0]!;
    const [mine, other] = await Promise.all([
      a.post("/ng-rollout/r1-a1/verify", { task: {}, answer: "y", _ng_group_id: "g1", _ng_rollout_index: 0 }, retriedCookie),
      a.post("/ng-rollout/r2/verify", { task: {}, answer: "z", _ng_group_id: "g1", _ng_rollout_index: 1 }, cookie2),
    ]);
    expect([mine.json(), other.json()]).toEqual([{ reward: 1 }, { reward: 1 }]);
    expect(judged).toEqual([["y", "z"]]);
  }, 15_000);
});

describe("CohortTable: a waiter whose request is stopped", () => {
  const coordinates = (index: number) => ({ groupId: "g1", attempt: 0, index });
  const member = (index: number, answer: string) => ({ index, answer, task: {} });
  const stopped = () => new CheckpointError("stale_attempt", "retired");

  it("leaves with the abort reason; the slot stays while an identical replay still waits on it", async () => {
    const table = new CohortTable({ ...DEFAULT_COHORT_SETTINGS, size: 2 }, async (members) => members.map((m) => m.index));
    const first = new AbortController();
    const leaving = table.arrive(coordinates(0), "d0", member(0, "a"), first.signal);
    const replay = table.arrive(coordinates(0), "d0", member(0, "a"), new AbortController().signal);
    first.abort(stopped());
    await expect(leaving).rejects.toMatchObject({ code: "stale_attempt" });
    await expect(table.arrive(coordinates(0), "other", member(0, "b"))).rejects.toMatchObject({ code: "cohort_slot_conflict" });
    const [zero, one] = await Promise.all([replay, table.arrive(coordinates(1), "d1", member(1, "c"))]);
    expect([zero, one]).toEqual([{ reward: 0 }, { reward: 1 }]);
  });

  it("a cohort every member left stops counting against maxActiveCohorts at once (not at its collection timeout); a later member opens it afresh", async () => {
    const table = new CohortTable({ ...DEFAULT_COHORT_SETTINGS, size: 2, maxActiveCohorts: 1 }, async (members) => members.map(() => 1));
    const stop = new AbortController();
    const leaving = table.arrive(coordinates(0), "d0", member(0, "a"), stop.signal);
    expect(table.activeCohorts).toBe(1);
    stop.abort(stopped());
    await expect(leaving).rejects.toMatchObject({ code: "stale_attempt" });
    expect(table.activeCohorts).toBe(0);
    // Another group fits now; the abandoned one's members can still gather later.
    const other = table.arrive({ groupId: "g2", attempt: 0, index: 0 }, "e0", member(0, "x"));
    await expect(table.arrive(coordinates(0), "d0", member(0, "a"))).rejects.toMatchObject({ code: "cohort_capacity" });
    await Promise.all([other, table.arrive({ groupId: "g2", attempt: 0, index: 1 }, "e1", member(1, "y"))]);
    const [zero, one] = await Promise.all([table.arrive(coordinates(0), "d0", member(0, "a")), table.arrive(coordinates(1), "d1", member(1, "c"))]);
    expect([zero, one]).toEqual([{ reward: 1 }, { reward: 1 }]);
  });

  it("gives the slot up when it was its last waiter, and refuses at once when already stopped", async () => {
    const table = new CohortTable({ ...DEFAULT_COHORT_SETTINGS, size: 2 }, async (members) => members.map(() => 1));
    const stop = new AbortController();
    const leaving = table.arrive(coordinates(0), "d0", member(0, "a"), stop.signal);
    stop.abort(stopped());
    await expect(leaving).rejects.toMatchObject({ code: "stale_attempt" });
    await expect(table.arrive(coordinates(1), "d1", member(1, "c"), stop.signal)).rejects.toMatchObject({ code: "stale_attempt" });
    const [zero, one] = await Promise.all([table.arrive(coordinates(0), "d0b", member(0, "b")), table.arrive(coordinates(1), "d1", member(1, "c"))]);
    expect([zero, one]).toEqual([{ reward: 1 }, { reward: 1 }]);
    expect(table.judgeCalls).toBe(1);
  });
});
