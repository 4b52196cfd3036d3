import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ReplayCounter, resourcesWorld } from "./resources-world.js";

/**
 * An `exported` server frees a finished session's state through retireSessionState once the
 * session ended (a 2xx close, verify or `sessions.ended`). A free that fails (a sandbox provider
 * that answers 503 once) must not leak the state for good: nothing else names a session that
 * ended, so it is held (live state, its id refused) and freed again by the next commit's clean-up,
 * a retire of its attempt or a forget of its rollout, as a left-out restored session's failed free is.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

/** The replayable counter whose first `failures` frees throw (a provider's transient error). */
class FlakyFreeCounter extends ReplayCounter {
  failures = 1;
  frees = 0;
  override async retireSessionState(sessionId: string): Promise<void> {
    this.frees += 1;
    if (this.failures > 0) {
      this.failures -= 1;
      throw new Error("provider: 503 while deleting the sandbox");
    }
    this.counters.delete(sessionId);
  }
}

const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

async function closedAfterFailedFree() {
  const server = new FlakyFreeCounter();
  const a = await world.harness(server);
  const seed = await a.post("/ng-rollout/r1/seed_session", {});
  const cookie = String(seed.headers["set-cookie"]).split(";")[0]!;
  await a.post("/ng-rollout/r1/increment", {}, cookie);
  expect((await a.post("/ng-rollout/r1/close_session", {}, cookie)).statusCode).toBe(200);
  await settle();
  // The SDK's free of the ended session failed: its state is still held by the server.
  expect({ frees: server.frees, counters: server.counters.size }).toEqual({ frees: 1, counters: 1 });
  return { server, a, cookie };
}

describe("an exported server's finished session whose free fails", () => {
  it("is freed again by the next commit's clean-up instead of leaking its state for good", async () => {
    const { server, a } = await closedAfterFailedFree();
    // Still live state here until freed: a restore would install beside a state the server holds.
    expect(a.kind.hasLiveState()).toBe(true);
    await a.call("prepare", { checkpoint_id: "c1" });
    await a.call("commit", { checkpoint_id: "c1", episode_ids: [] });
    await a.call("resume", { checkpoint_id: "c1" });
    await settle();
    expect({ frees: server.frees, counters: server.counters.size, live: a.kind.hasLiveState() }).toEqual({ frees: 2, counters: 0, live: false });
  });

  it("is freed by a forget of its rollout", async () => {
    const { server, a } = await closedAfterFailedFree();
    await a.call("forget", { checkpoint_id: "forget", rollout_ids: ["r1"] });
    expect({ frees: server.frees, counters: server.counters.size, live: a.kind.hasLiveState() }).toEqual({ frees: 2, counters: 0, live: false });
  });

  it("is freed by a retire of its attempt before the retire replies", async () => {
    const { server, a } = await closedAfterFailedFree();
    await a.call("retire", { checkpoint_id: "retire", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect({ frees: server.frees, counters: server.counters.size, live: a.kind.hasLiveState() }).toEqual({ frees: 2, counters: 0, live: false });
  });

  it("a retire of its attempt arriving while that free still runs replies only once the state is freed (again, when the free failed)", async () => {
    const server = new FlakyFreeCounter();
    let release!: () => void;
    const held = new Promise<void>((resolve) => (release = resolve));
    const free = server.retireSessionState.bind(server);
    server.retireSessionState = async (sessionId: string) => {
      await held;
      await free(sessionId);
    };
    const a = await world.harness(server);
    const seed = await a.post("/ng-rollout/r1/seed_session", {});
    const cookie = String(seed.headers["set-cookie"]).split(";")[0]!;
    expect((await a.post("/ng-rollout/r1/close_session", {}, cookie)).statusCode).toBe(200);
    let replied = false;
    const retire = a.call("retire", { checkpoint_id: "retire", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }).then(() => (replied = true));
    for (let i = 0; i < 20; i++) await settle();
    // Retire stops, frees, then replies: not while the attempt's state is still being freed.
    expect({ replied, counters: server.counters.size }).toEqual({ replied: false, counters: 1 });
    release(); // that free fails (the provider's 503); the retire frees it again
    await retire;
    expect({ frees: server.frees, counters: server.counters.size, live: a.kind.hasLiveState() }).toEqual({ frees: 2, counters: 0, live: false });
  });
});
