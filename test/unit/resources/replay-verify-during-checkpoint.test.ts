import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { REPLAYABLE_END_HOLD_MS } from "../../../participants/kinds/resources/index.js";
import { ReplayCounter, resourcesWorld } from "./resources-world.js";

/**
 * A replayable `/verify` is served while a checkpoint is open. The environment's checkpoint then
 * holds the episode at its boundary *before* verify, and after a crash the restored episode sends
 * the verify again: the session it names must be in the same checkpoint, or an `exported` server
 * re-runs it on state it no longer has.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());


describe("a replayable verify that succeeds while a checkpoint is open", () => {
  it("keeps its session in that checkpoint, so the verify replayed after a crash sees the restored state", async () => {
    const a = await world.harness(new ReplayCounter());
    const seeded = await a.post("/ng-rollout/r1/seed_session", {});
    const cookie = String(seeded.headers["set-cookie"]).split(";")[0]!;
    for (let i = 0; i < 2; i++) expect((await a.post("/ng-rollout/r1/increment", {}, cookie)).json()).toEqual({ count: i + 1 });

    await a.call("prepare", { checkpoint_id: "c1" });
    // Served during the checkpoint (replayable): the environment is checkpointed before it.
    expect((await a.post("/ng-rollout/r1/verify", { expected: 2 }, cookie)).json()).toEqual({ reward: 1, count: 2 });
    const committed = await a.call("commit", { checkpoint_id: "c1" });
    expect(committed.episode_ids).toEqual(["r1"]);
    // The process crashes here.

    const b = await world.harness(new ReplayCounter());
    await b.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await b.call("resume", { checkpoint_id: "c1" });
    expect((await b.post("/ng-rollout/r1-a1/verify", { expected: 2 }, cookie)).json()).toEqual({ reward: 1, count: 2 });
    b.clock.advance(REPLAYABLE_END_HOLD_MS); // past the hold after a replayable verify
    expect(b.kind.readiness().counts).toMatchObject({ sessions: 0 });
  });

  it("ends the session once the checkpoint resumed", async () => {
    const a = await world.harness(new ReplayCounter());
    const seeded = await a.post("/ng-rollout/r1/seed_session", {});
    const cookie = String(seeded.headers["set-cookie"]).split(";")[0]!;
    await a.call("prepare", { checkpoint_id: "c1" });
    expect((await a.post("/ng-rollout/r1/verify", { expected: 0 }, cookie)).statusCode).toBe(200);
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1 });
    await a.call("resume", { checkpoint_id: "c1" });
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 0 });
  });
});
