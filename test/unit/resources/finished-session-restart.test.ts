import type { FastifyInstance } from "fastify";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { REPLAYABLE_END_HOLD_MS, type SessionAccess } from "../../../participants/kinds/resources/index.js";
import { ReplayCounter, resourcesWorld } from "./resources-world.js";

/**
 * An `exported` server frees a finished session's state through its retire hook, which may take a
 * while. A reset (`sessions.started`) whose request still carries that session's cookie must not
 * start its new session under the id being freed: the running free would delete the new state.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
type Harness = Awaited<ReturnType<typeof world.harness>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

class SlowFreeResetCounter extends ReplayCounter {
  hold: Promise<void> | undefined;
  /** The last free of a session's state, settled once it deleted it. */
  freed: Promise<void> | undefined;
  override routes(app: FastifyInstance, sessions: SessionAccess): void {
    super.routes(app, sessions);
    app.post("/reset", async (request) => (this.counters.set(sessions.started(request), 0), {}));
  }
  override retireSessionState(sessionId: string): Promise<void> {
    this.freed = (async () => {
      await this.hold;
      this.counters.delete(sessionId);
    })();
    return this.freed;
  }
}

/** The cookie a reply set, or `previous` when it set none. */
function cookieAfter(reply: { headers: Record<string, unknown> }, previous: string): string {
  const set = reply.headers["set-cookie"];
  return set === undefined ? previous : String(set).split(";")[0]!;
}

/** Counts twice in the session `cookie` names, lets the held free finish, and verifies the count. */
async function countTwiceThenFree(a: Harness, server: SlowFreeResetCounter, release: () => void, cookie: string): Promise<unknown> {
  await a.post("/ng-rollout/r1/increment", {}, cookie);
  await a.post("/ng-rollout/r1/increment", {}, cookie);
  release();
  await server.freed;
  return (await a.post("/ng-rollout/r1/verify", { expected: 2 }, cookie)).json();
}

describe("a reset carrying the cookie of a finished session whose free still runs", () => {
  it("starts a new session under a fresh id; the running free does not delete its state", async () => {
    const server = new SlowFreeResetCounter();
    const a = await world.harness(server, "worker-0", { replayableEndHoldMs: 0 });
    const first = String((await a.post("/ng-rollout/r1/reset", {})).headers["set-cookie"]).split(";")[0]!;
    await a.post("/ng-rollout/r1/increment", {}, first);
    let release!: () => void;
    server.hold = new Promise<void>((resolve) => (release = resolve));
    expect((await a.post("/ng-rollout/r1/verify", { expected: 1 }, first)).json()).toEqual({ reward: 1, count: 1 });

    // The client's cookie jar still sends the finished session's cookie with the next reset.
    const again = await a.post("/ng-rollout/r1/reset", {}, first);
    expect(again.statusCode).toBe(200);
    expect(await countTwiceThenFree(a, server, release, cookieAfter(again, first))).toEqual({ reward: 1, count: 2 });
  });
});

describe("a seed carrying the cookie of a session a replayable verify ended during a checkpoint", () => {
  it("waits for resume and then seeds under a fresh id; the free at reopen does not delete its state", async () => {
    const server = new SlowFreeResetCounter();
    const a = await world.harness(server);
    const first = String((await a.post("/ng-rollout/r1/seed_session", {})).headers["set-cookie"]).split(";")[0]!;
    await a.post("/ng-rollout/r1/increment", {}, first);
    await a.call("prepare", { checkpoint_id: "c1" });
    // Served during the checkpoint: the session ends at reopen, and its state is freed then.
    expect((await a.post("/ng-rollout/r1/verify", { expected: 1 }, first)).json()).toEqual({ reward: 1, count: 1 });
    // The next episode's seed still carries the cookie; it waits for resume.
    const seeding = a.post("/ng-rollout/r1/seed_session", {}, first);
    await new Promise<void>((resolve) => setImmediate(resolve));
    await a.call("commit", { checkpoint_id: "c1" });
    let release!: () => void;
    server.hold = new Promise<void>((resolve) => (release = resolve));
    await a.call("resume", { checkpoint_id: "c1" });
    const again = await seeding;
    expect(again.statusCode).toBe(200);
    expect(await countTwiceThenFree(a, server, release, cookieAfter(again, first))).toEqual({ reward: 1, count: 2 });
  });
});

/** Its seed waits (`gate`) inside the handler, after it set the session's state. */
class GatedSeedCounter extends SlowFreeResetCounter {
  gate: Promise<void> | undefined;
  entered: (() => void) | undefined;
  protected override async seed(sessionId: string): Promise<void> {
    await super.seed(sessionId);
    this.entered?.();
    await this.gate;
  }
}

describe("a seed carrying the cookie of a held session whose hold passes while the seed runs", () => {
  it("keeps the session it took up: the hold's end neither ends it nor frees its state", async () => {
    const server = new GatedSeedCounter();
    const a = await world.harness(server);
    const first = String((await a.post("/ng-rollout/r1/seed_session", {})).headers["set-cookie"]).split(";")[0]!;
    await a.post("/ng-rollout/r1/increment", {}, first);
    expect((await a.post("/ng-rollout/r1/verify", { expected: 1 }, first)).json()).toEqual({ reward: 1, count: 1 });

    let open!: () => void;
    server.gate = new Promise<void>((resolve) => (open = resolve));
    const entered = new Promise<void>((resolve) => (server.entered = resolve));
    const seeding = a.post("/ng-rollout/r1/seed_session", {}, first);
    await entered;
    let release!: () => void;
    server.hold = new Promise<void>((resolve) => (release = resolve));
    a.clock.advance(REPLAYABLE_END_HOLD_MS);
    await new Promise<void>((resolve) => setImmediate(resolve));
    open();
    const again = await seeding;
    expect(again.statusCode).toBe(200);
    const cookie = cookieAfter(again, first);
    expect(await countTwiceThenFree(a, server, release, cookie)).toEqual({ reward: 1, count: 2 });
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1 });
  });
});
