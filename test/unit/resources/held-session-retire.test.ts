import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { counterRecord, ReplayCounter, resourcesWorld } from "./resources-world.js";

/**
 * A retire frees and drops a session whose replayable `/verify` left it held for a checkpoint. Its
 * hold must go with it: left behind, it ends (and in `exported` mode frees) whatever session later
 * carries that id as that episode, here the same session restored again after a forget.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

describe("a held session's retire", () => {
  it("takes its hold along: the session restored again after a forget is not ended by it", async () => {
    await world.writeCheckpoint("c1", [counterRecord("r1", "session-1", 2)]);
    await world.writeCheckpoint("c2", [counterRecord("r1", "session-1", 2)]);
    const server = new ReplayCounter();
    const b = await world.harness(server);
    const cookie = "ng_session=session-1";
    await b.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await b.call("resume", { checkpoint_id: "c1" });
    // The restored episode's verify (replayable) leaves its session held.
    expect((await b.post("/ng-rollout/r1-a1/verify", { expected: 2 }, cookie)).json()).toEqual({ reward: 1, count: 2 });
    // The controller retires that attempt and forgets the rollout, then restores it again.
    await b.call("retire", { checkpoint_id: "x1", episode_ids: [{ rollout_id: "r1", attempt: 1 }] });
    await b.call("forget", { checkpoint_id: "f1", rollout_ids: ["r1"] });
    expect(b.kind.hasLiveState()).toBe(false);
    await b.call("restore", { checkpoint_id: "c2", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await b.call("resume", { checkpoint_id: "c2" });
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(b.kind.readiness().counts).toMatchObject({ sessions: 1, restored: 1 });
    expect((await b.post("/ng-rollout/r1-a1/verify", { expected: 2 }, cookie)).json()).toEqual({ reward: 1, count: 2 });
  });
});
