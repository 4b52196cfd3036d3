import type { FastifyInstance } from "fastify";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { REPLAYABLE_END_HOLD_MS, type SessionAccess } from "../../../participants/kinds/resources/index.js";
import { ReplayCounter, resourcesWorld } from "./resources-world.js";

/**
 * A session a replayable `/verify` ended is held for a while (for a checkpoint that may be under
 * way). A seed (or `sessions.started`) of the same episode that still carries its cookie takes it
 * up again, live: the hold must not end it (nor, in `exported` mode, free its new state) when it
 * would have passed.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

const cookieOf = (reply: { headers: Record<string, unknown> }, fallback: string) => {
  const set = reply.headers["set-cookie"];
  return set === undefined ? fallback : String(set).split(";")[0]!;
};

describe("a seed of the same episode during the hold of its verified session", () => {
  it("takes it up again, live: the hold's end leaves it alone (its new state kept, exported by a later checkpoint)", async () => {
    const server = new ReplayCounter();
    const a = await world.harness(server);
    const first = String((await a.post("/ng-rollout/r1/seed_session", {})).headers["set-cookie"]).split(";")[0]!;
    await a.post("/ng-rollout/r1/increment", {}, first);
    expect((await a.post("/ng-rollout/r1/verify", { expected: 1 }, first)).json()).toEqual({ reward: 1, count: 1 });

    // The client's cookie jar still sends the verified session's cookie with the next seed.
    const again = await a.post("/ng-rollout/r1/seed_session", {}, first);
    expect(again.statusCode).toBe(200);
    const cookie = cookieOf(again, first);
    for (let i = 0; i < 2; i++) await a.post("/ng-rollout/r1/increment", {}, cookie);

    a.clock.advance(REPLAYABLE_END_HOLD_MS);
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1 });
    await a.call("prepare", { checkpoint_id: "c1" });
    expect((await a.call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual(["r1"]);
    await a.call("resume", { checkpoint_id: "c1" });
    expect((await a.post("/ng-rollout/r1/verify", { expected: 2 }, cookie)).json()).toEqual({ reward: 1, count: 2 });
  });

  it("a `sessions.started` route (reset) likewise takes it up again, and the hold's end leaves it alone", async () => {
    const server = new ResetCounter();
    const a = await world.harness(server);
    const first = String((await a.post("/ng-rollout/r1/reset", {})).headers["set-cookie"]).split(";")[0]!;
    await a.post("/ng-rollout/r1/increment", {}, first);
    expect((await a.post("/ng-rollout/r1/verify", { expected: 1 }, first)).json()).toEqual({ reward: 1, count: 1 });

    const again = await a.post("/ng-rollout/r1/reset", {}, first);
    expect(again.statusCode).toBe(200);
    const cookie = cookieOf(again, first);
    for (let i = 0; i < 3; i++) await a.post("/ng-rollout/r1/increment", {}, cookie);

    a.clock.advance(REPLAYABLE_END_HOLD_MS);
    await new Promise<void>((resolve) => setImmediate(resolve));
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1 });
    expect((await a.post("/ng-rollout/r1/verify", { expected: 3 }, cookie)).json()).toEqual({ reward: 1, count: 3 });
  });
});

/** A reset/step protocol: `/reset` starts the session through `sessions.started`. */
class ResetCounter extends ReplayCounter {
  override routes(app: FastifyInstance, sessions: SessionAccess): void {
    super.routes(app, sessions);
    app.post("/reset", async (request) => (this.counters.set(sessions.started(request), 0), {}));
  }
}
