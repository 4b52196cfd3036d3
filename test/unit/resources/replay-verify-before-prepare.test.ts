import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { REPLAYABLE_END_HOLD_MS } from "../../../participants/kinds/resources/index.js";
import { ReplayCounter, resourcesWorld } from "./resources-world.js";

/**
 * A checkpoint prepares the environment first and this server last. A replayable `/verify` this
 * server answers in between (its admission still open) may reach the environment after that
 * environment was prepared: the checkpoint then holds the episode at its boundary *before* the
 * verify, and the restored episode sends the verify again. The session it names must still be in
 * the same checkpoint, so a session a replayable verify ended stays held a while (the hold) and a
 * prepare within it exports the session and ends it at resume.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

async function seededCounter(a: Awaited<ReturnType<typeof world.harness>>, increments: number) {
  const cookie = String((await a.post("/ng-rollout/r1/seed_session", {})).headers["set-cookie"]).split(";")[0]!;
  for (let i = 0; i < increments; i++) await a.post("/ng-rollout/r1/increment", {}, cookie);
  return cookie;
}

describe("a replayable verify served just before this server's prepare", () => {
  it("leaves its session in that checkpoint, so the verify the restored episode replays finds its state", async () => {
    const a = await world.harness(new ReplayCounter());
    const cookie = await seededCounter(a, 2);
    // Answered while this server's admission is open: the environment was prepared meanwhile.
    expect((await a.post("/ng-rollout/r1/verify", { expected: 2 }, cookie)).json()).toEqual({ reward: 1, count: 2 });
    a.clock.advance(REPLAYABLE_END_HOLD_MS - 1);
    await a.call("prepare", { checkpoint_id: "c1" });
    a.clock.advance(1); // past the hold: the checkpoint holds it now, until its resume
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1 });
    expect((await a.call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual(["r1"]);
    // The process crashes here.

    const b = await world.harness(new ReplayCounter());
    await b.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await b.call("resume", { checkpoint_id: "c1" });
    expect((await b.post("/ng-rollout/r1-a1/verify", { expected: 2 }, cookie)).json()).toEqual({ reward: 1, count: 2 });
  });

  it("ends it at that checkpoint's resume", async () => {
    const server = new ReplayCounter();
    const a = await world.harness(server);
    const cookie = await seededCounter(a, 1);
    await a.post("/ng-rollout/r1/verify", { expected: 1 }, cookie);
    await a.call("prepare", { checkpoint_id: "c1" });
    await a.call("resume", { checkpoint_id: "c1" });
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 0 });
    expect(server.counters.size).toBe(0);
  });

  it("a later prepare no longer holds it: the hold passed and the session ended", async () => {
    const a = await world.harness(new ReplayCounter());
    const cookie = await seededCounter(a, 1);
    await a.post("/ng-rollout/r1/verify", { expected: 1 }, cookie);
    a.clock.advance(REPLAYABLE_END_HOLD_MS);
    await a.call("prepare", { checkpoint_id: "c1" });
    expect((await a.call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual([]);
  });

  it("a close after the verify ends the session at once, and the hold's end later changes nothing", async () => {
    const server = new ReplayCounter();
    const a = await world.harness(server);
    const cookie = await seededCounter(a, 1);
    await a.post("/ng-rollout/r1/verify", { expected: 1 }, cookie);
    expect((await a.post("/ng-rollout/r1/close_session", {}, cookie)).statusCode).toBe(200);
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 0 });
    expect(server.counters.size).toBe(0);
    // A new session of the same rollout is not ended by the first one's hold.
    const again = await seededCounter(a, 0);
    a.clock.advance(REPLAYABLE_END_HOLD_MS);
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1 });
    expect(again).not.toBe(cookie);
  });

  it("replayableEndHoldMs 0 ends it at once, as before the hold", async () => {
    const server = new ReplayCounter();
    const a = await world.harness(server, "worker-0", { replayableEndHoldMs: 0 });
    const cookie = await seededCounter(a, 1);
    await a.post("/ng-rollout/r1/verify", { expected: 1 }, cookie);
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 0 });
    expect(server.counters.size).toBe(0);
  });
});
