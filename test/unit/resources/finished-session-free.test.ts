import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { REPLAYABLE_END_HOLD_MS } from "../../../participants/kinds/resources/index.js";
import { counterRecord, ReplayCounter, resourcesWorld } from "./resources-world.js";

/**
 * An `exported` server whose `/verify` is replayable must not free its session's state in that
 * handler (a verify served during a checkpoint is exported after it), so the SDK frees it once the
 * session's end takes effect; without that, every finished session's state was held for good.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

/** The replayable counter, whose free of a session's state can be held (`hold`). */
class HeldFreeCounter extends ReplayCounter {
  /** A free that has not ended yet, when set. */
  hold: Promise<void> | undefined;
  override async retireSessionState(sessionId: string): Promise<void> {
    await this.hold;
    this.counters.delete(sessionId);
  }
}

async function seeded(a: Awaited<ReturnType<typeof world.harness>>, rollout = "r1") {
  const reply = await a.post(`/ng-rollout/${rollout}/seed_session`, {});
  return String(reply.headers["set-cookie"]).split(";")[0]!;
}

describe("an exported server's finished session", () => {
  it("a replayable verify served outside a checkpoint frees its state once its hold passed", async () => {
    const server = new HeldFreeCounter();
    const a = await world.harness(server);
    const cookie = await seeded(a);
    await a.post("/ng-rollout/r1/increment", {}, cookie);
    expect((await a.post("/ng-rollout/r1/verify", { expected: 1 }, cookie)).json()).toEqual({ reward: 1, count: 1 });
    a.clock.advance(REPLAYABLE_END_HOLD_MS - 1);
    expect(server.counters.size).toBe(1);
    a.clock.advance(1);
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(server.counters.size).toBe(0);
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 0 });
  });

  it("one served during a checkpoint keeps its state for that checkpoint's export, and frees it at resume", async () => {
    const server = new HeldFreeCounter();
    const a = await world.harness(server);
    const cookie = await seeded(a);
    await a.post("/ng-rollout/r1/increment", {}, cookie);
    await a.call("prepare", { checkpoint_id: "c1" });
    expect((await a.post("/ng-rollout/r1/verify", { expected: 1 }, cookie)).json()).toEqual({ reward: 1, count: 1 });
    expect(server.counters.size).toBe(1);
    const committed = await a.call("commit", { checkpoint_id: "c1" });
    expect(committed.episode_ids).toEqual(["r1"]);
    await a.call("resume", { checkpoint_id: "c1" });
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(server.counters.size).toBe(0);
  });

  it("a restored session's replayed verify frees it too", async () => {
    await world.writeCheckpoint("c1", [counterRecord("r1", "session-1", 2)]);
    const server = new HeldFreeCounter();
    const b = await world.harness(server);
    await b.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await b.call("resume", { checkpoint_id: "c1" });
    expect((await b.post("/ng-rollout/r1-a1/verify", { expected: 2 }, "ng_session=session-1")).json()).toEqual({ reward: 1, count: 2 });
    b.clock.advance(REPLAYABLE_END_HOLD_MS);
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(server.counters.size).toBe(0);
  });

  it("a free still running is live state until it ended (a restore must not install that id under the free)", async () => {
    const server = new HeldFreeCounter();
    let release!: () => void;
    server.hold = new Promise<void>((resolve) => (release = resolve));
    const a = await world.harness(server);
    const cookie = await seeded(a);
    await a.post("/ng-rollout/r1/verify", { expected: 0 }, cookie);
    a.clock.advance(REPLAYABLE_END_HOLD_MS);
    expect(a.kind.hasLiveState()).toBe(true);
    release();
    await server.hold;
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(a.kind.hasLiveState()).toBe(false);
    expect(server.counters.size).toBe(0);
  });

  it("a wait-mode server that frees in its own handler is freed again harmlessly (the hook tolerates it)", async () => {
    const server = new CounterServer();
    const a = await world.harness(server);
    const cookie = await seeded(a);
    expect((await a.post("/ng-rollout/r1/verify", { expected: 0 }, cookie)).json()).toEqual({ reward: 1, count: 0 });
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(server.counters.size).toBe(0);
    expect(a.kind.hasLiveState()).toBe(false);
  });
});
