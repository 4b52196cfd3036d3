import { request, type ClientRequest } from "node:http";
import type { AddressInfo } from "node:net";
import type { FastifyInstance } from "fastify";
import { afterEach, describe, expect, it } from "vitest";
import { createResourcesApp, type SessionAccess } from "../../participants/kinds/resources/index.js";
import { CounterServer } from "../../participants/gym/resources-server/counter-server.js";
import { waitUntil } from "../support/wait-until.js";

// A resources server over a real socket: a client that disconnects while a tool call runs does not
// end the call for checkpointing — the handler still changes the session until it replies, so the
// request stays in flight (a retire waits for it) until then.
class GatedServer extends CounterServer {
  release: () => void = () => undefined;
  entered = false;
  finished = false;
  override routes(app: FastifyInstance, sessions: SessionAccess): void {
    super.routes(app, sessions);
    app.post("/slow_tool", async () => {
      this.entered = true;
      await new Promise<void>((resolve) => (this.release = resolve));
      this.finished = true;
      return { ok: true };
    });
  }
}

let app: FastifyInstance | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

describe("resources: a client that disconnects mid-call", () => {
  it("keeps the call in flight until its handler replies, so retire waits for it", async () => {
    const server = new GatedServer();
    const built = await createResourcesApp(server, { owner: "w0" });
    app = built.app;
    await app.listen({ port: 0, host: "127.0.0.1" });
    const base = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
    const seeded = await fetch(`${base}/ng-rollout/ab-1/seed_session`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    const cookie = String(seeded.headers.get("set-cookie")).split(";")[0]!;
    let client: ClientRequest | undefined;
    const failed = new Promise<void>((resolve) => {
      client = request(`${base}/ng-rollout/ab-1/slow_tool`, { method: "POST", headers: { "content-type": "application/json", cookie } });
      client.on("error", () => resolve());
      client.end("{}");
    });
    await waitUntil(() => server.entered, "the handler to start");
    client!.destroy(); // the caller gives up (its own retire, a deadline)
    await failed;
    expect(built.kind.readiness().counts.inflight).toBe(1);
    let retired = false;
    const retiring = built.kind.retire([{ rollout_id: "ab-1", attempt: 0 }]).then(() => (retired = true));
    await new Promise((resolve) => setImmediate(resolve));
    expect(retired).toBe(false); // stop, then free: the handler is still running
    server.release();
    await retiring;
    expect(server.finished).toBe(true);
    expect(built.kind.readiness().counts.inflight).toBe(0);
  });
});
