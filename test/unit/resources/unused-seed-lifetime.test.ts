import type { FastifyInstance } from "fastify";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointError } from "../../../protocol/index.js";
import { UNUSED_SEED_LIFETIME_MS, type SessionAccess } from "../../../participants/kinds/resources/index.js";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { resourcesWorld } from "./resources-world.js";

/**
 * A `/seed_session` whose reply never reached the agent (the connection was cut after the server
 * bound the session) leaves a session nobody can name: no request ever verifies or closes it. It
 * ends once it stayed unused for `unusedSeedLifetimeMs`, and in `exported` mode its state is freed.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

const settle = () => new Promise<void>((resolve) => setImmediate(resolve));
const cookieOf = (reply: { headers: Record<string, unknown> }) => String(reply.headers["set-cookie"]).split(";")[0]!;

describe("a seeded session that is never used", () => {
  it("ends after the default lifetime, its state freed, and no checkpoint exports it any more", async () => {
    const server = new CounterServer();
    const a = await world.harness(server);
    expect((await a.post("/ng-rollout/r1/seed_session", {})).statusCode).toBe(200); // its reply "lost"
    a.clock.advance(UNUSED_SEED_LIFETIME_MS - 1);
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1 });
    a.clock.advance(1);
    await settle();
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 0 });
    expect(server.counters.size).toBe(0);
    await a.call("prepare", { checkpoint_id: "c1" });
    expect((await a.call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual([]);
    await a.call("resume", { checkpoint_id: "c1" });
  });

  it("a session used once is not ended by the lifetime", async () => {
    const server = new CounterServer();
    const a = await world.harness(server, "worker-0", { unusedSeedLifetimeMs: 1_000 });
    const cookie = cookieOf(await a.post("/ng-rollout/r1/seed_session", {}));
    await a.post("/ng-rollout/r1/increment", {}, cookie);
    a.clock.advance(5_000);
    await settle();
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1 });
    expect((await a.post("/ng-rollout/r1/verify", { expected: 1 }, cookie)).json()).toEqual({ reward: 1, count: 1 });
  });

  it("a lifetime passing while a checkpoint is open frees nothing until its resume", async () => {
    const server = new CounterServer();
    const a = await world.harness(server, "worker-0", { unusedSeedLifetimeMs: 1_000 });
    await a.post("/ng-rollout/r1/seed_session", {});
    await a.call("prepare", { checkpoint_id: "c1" });
    a.clock.advance(5_000);
    await settle();
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1 });
    expect(server.counters.size).toBe(1);
    expect((await a.call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual(["r1"]);
    await a.call("resume", { checkpoint_id: "c1" });
    await settle();
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 0 });
    expect(server.counters.size).toBe(0);
  });

  it("a request waiting for resume uses the session: the lifetime passing meanwhile does not end it", async () => {
    const server = new CounterServer();
    const a = await world.harness(server, "worker-0", { unusedSeedLifetimeMs: 1_000 });
    const cookie = cookieOf(await a.post("/ng-rollout/r1/seed_session", {}));
    await a.call("prepare", { checkpoint_id: "c1" });
    const incrementing = a.post("/ng-rollout/r1/increment", {}, cookie);
    await settle();
    a.clock.advance(5_000);
    await a.call("commit", { checkpoint_id: "c1" });
    await a.call("resume", { checkpoint_id: "c1" });
    expect((await incrementing).json()).toEqual({ count: 1 });
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1 });
    expect((await a.post("/ng-rollout/r1/verify", { expected: 1 }, cookie)).json()).toEqual({ reward: 1, count: 1 });
  });

  it("a seed taking the session up again restarts its lifetime; the first one's timer does not end it", async () => {
    const server = new CounterServer();
    const a = await world.harness(server, "worker-0", { unusedSeedLifetimeMs: 1_000 });
    const cookie = cookieOf(await a.post("/ng-rollout/r1/seed_session", {}));
    a.clock.advance(600);
    const again = await a.post("/ng-rollout/r1/seed_session", {}, cookie);
    expect(again.headers["set-cookie"]).toBeUndefined(); // the same session, taken up again
    a.clock.advance(600);
    await settle();
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 1 });
    a.clock.advance(400);
    await settle();
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 0 });
    expect(server.counters.size).toBe(0);
  });

  it("a session sessions.started() bound whose request is refused or left unanswered ends with no lifetime timer left scheduled", async () => {
    /** A reset/step protocol whose reset fails after `sessions.started`: refused, or its reply hijacked. */
    class FailingReset extends CounterServer {
      override routes(app: FastifyInstance, sessions: SessionAccess): void {
        super.routes(app, sessions);
        app.post("/reset", async (request) => {
          sessions.started(request);
          throw new CheckpointError("invalid_request", "this reset is refused");
        });
        app.post("/reset_hijacked", async (request, reply) => {
          sessions.started(request);
          reply.hijack();
          reply.raw.writeHead(200, { "content-type": "application/json" });
          reply.raw.end("{}");
        });
      }
    }
    const a = await world.harness(new FailingReset());
    expect(a.clock.pendingTimers).toBe(0);
    expect((await a.post("/ng-rollout/r1/reset", {})).statusCode).toBe(400);
    await a.post("/ng-rollout/r2/reset_hijacked", {});
    for (let i = 0; i < 100 && (a.kind.readiness().counts?.inflight ?? 0) > 0; i++) await settle();
    expect(a.kind.readiness().counts).toMatchObject({ sessions: 0, inflight: 0 });
    // Before: each ended session kept its (no-op) lifetime timer, for up to an hour by default.
    expect(a.clock.pendingTimers).toBe(0);
  });
});
