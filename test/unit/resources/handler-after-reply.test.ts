import type { FastifyInstance } from "fastify";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { SessionAccess } from "../../../participants/kinds/resources/index.js";
import { CounterServer } from "../../../participants/gym/resources-server/counter-server.js";
import { resourcesWorld } from "./resources-world.js";

/**
 * An async handler may send its reply and go on changing the session (reply early, then persist):
 * Fastify runs onSend at `reply.send`, long before the handler settles. The request must count in
 * flight until both its reply ended and its handler settled, or a prepare passes while the handler
 * still writes the state the commit then exports without that write.
 */
let world: Awaited<ReturnType<typeof resourcesWorld>>;
beforeEach(async () => (world = await resourcesWorld()));
afterEach(() => world.close());

class EarlyReplyCounter extends CounterServer {
  /** Released by the test: the handler's work after its reply. */
  release!: () => void;
  replied!: Promise<void>;
  private repliedNow!: () => void;
  constructor() {
    super();
    this.replied = new Promise<void>((resolve) => (this.repliedNow = resolve));
  }
  override routes(app: FastifyInstance, sessions: SessionAccess): void {
    super.routes(app, sessions);
    app.post("/increment_late", async (request, reply) => {
      const { sessionId } = sessions.require(request);
      const count = (this.counters.get(sessionId) ?? 0) + 1;
      reply.send({ count });
      this.repliedNow();
      await new Promise<void>((resolve) => (this.release = resolve));
      this.counters.set(sessionId, count);
    });
  }
}

describe("a handler still running after its reply", () => {
  it("holds up prepare until it settled, so the commit exports what it wrote", async () => {
    const server = new EarlyReplyCounter();
    const a = await world.harness(server);
    const cookie = String((await a.post("/ng-rollout/r1/seed_session", {})).headers["set-cookie"]).split(";")[0]!;
    const response = await a.post("/ng-rollout/r1/increment_late", {}, cookie);
    expect(response.json()).toEqual({ count: 1 });
    await server.replied;
    // The handler has not written its count yet: the request is still in flight.
    expect(a.kind.readiness()).toMatchObject({ blockers: ["r1"], counts: { inflight: 1 } });
    const prepared = a.call("prepare", { checkpoint_id: "c1" }, 5);
    const early = await Promise.race([prepared.then((p) => p.phase), new Promise<string>((resolve) => setImmediate(() => resolve("waiting")))]);
    expect(early).toBe("waiting");
    server.release();
    expect((await prepared).phase).toBe("prepared");
    await a.call("commit", { checkpoint_id: "c1" });
    await a.call("resume", { checkpoint_id: "c1" });

    const b = await world.harness(new CounterServer());
    await b.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await b.call("resume", { checkpoint_id: "c1" });
    expect((await b.post("/ng-rollout/r1-a1/increment", {}, cookie)).json()).toEqual({ count: 2 });
  });
});
