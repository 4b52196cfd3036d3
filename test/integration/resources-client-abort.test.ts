import { request, type ClientRequest } from "node:http";
import { Readable } from "node:stream";
import { connect, type AddressInfo, type Socket } from "node:net";
import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { afterEach, describe, expect, it } from "vitest";
import { createResourcesApp, type ResourcesKind, type SessionAccess } from "../../participants/kinds/resources/index.js";
import { CounterServer } from "../../participants/gym/resources-server/counter-server.js";
import { waitUntil } from "../support/wait-until.js";

// A resources server over a real socket: a client that disconnects while a tool call runs does not
// end the call for checkpointing — the handler still changes the session until it replies, so the
// request stays in flight (a retire waits for it) until then.
class GatedServer extends CounterServer {
  release: () => void = () => undefined;
  entered = false;
  finished = false;
  kind: ResourcesKind | undefined;
  /** A hook of a gated route is waiting for `open()`; the client of that request went away. */
  holding = false;
  clientGone = false;
  private opened!: () => void;
  private readonly gate = new Promise<void>((resolve) => (this.opened = resolve));
  /** What a gated handler saw, and what the gated routes answered. */
  inflightInHandler: number | undefined;
  readonly events = new Readable({ read: () => undefined });
  readonly replies: { status: number; body: string }[] = [];
  /** Set by /streamed_terminal: calls `sessions.ended` for that request. */
  endSession: (() => void) | undefined;

  open(): void {
    this.opened();
  }

  override routes(app: FastifyInstance, sessions: SessionAccess): void {
    super.routes(app, sessions);
    app.post("/slow_tool", async () => {
      this.entered = true;
      await new Promise<void>((resolve) => (this.release = resolve));
      this.finished = true;
      return { ok: true };
    });
    const park = async (_request: FastifyRequest, reply: FastifyReply) => {
      reply.raw.once("close", () => (this.clientGone = true));
      this.holding = true;
      await this.gate;
    };
    const increment = async (request: FastifyRequest) => {
      this.entered = true;
      this.inflightInHandler = this.kind!.readiness().counts.inflight;
      const { sessionId } = sessions.require(request);
      this.counters.set(sessionId, (this.counters.get(sessionId) ?? 0) + 1);
      return {};
    };
    const record = async (_request: FastifyRequest, reply: FastifyReply, payload: unknown) => {
      this.replies.push({ status: reply.statusCode, body: String(payload) });
      return payload;
    };
    // Its handler holds until `open()`, then resolves nothing: Fastify answers no one whose client left.
    app.post("/hold_then_nothing", async (_request, reply) => {
      reply.raw.once("close", () => (this.clientGone = true));
      this.holding = true;
      await this.gate;
      this.finished = true;
    });
    // Answers on the raw socket itself: Fastify runs no onSend.
    app.post("/hijacked", async (_request, reply) => {
      reply.hijack();
      reply.raw.writeHead(200, { "content-type": "application/json" });
      reply.raw.end("{}");
    });
    // Hijacked synchronously; the handler answers on the raw socket only once `open()` is called.
    app.post("/hijacked_later", (_request, reply) => {
      reply.hijack();
      this.holding = true;
      void this.gate.then(() => {
        reply.raw.writeHead(200, { "content-type": "application/json" });
        reply.raw.end("{}");
      });
    });
    // A streamed reply (an MCP call's SSE): the test pushes its events and ends it.
    app.post("/streamed", async (_request, reply) => {
      reply.raw.once("close", () => (this.clientGone = true));
      return reply.type("text/event-stream").send(this.events);
    });
    // A streamed terminal step: its handler learns the episode ended while it streams (after onSend).
    app.post("/streamed_terminal", async (request, reply) => {
      this.endSession = () => sessions.ended(request);
      return reply.type("text/event-stream").send(this.events);
    });
    // Parked after its body was read (an async preValidation hook of the server's own).
    app.post("/read_then_park", { preValidation: park, onSend: record }, increment);
    // Parked before its body is read (an async onRequest hook of the server's own).
    app.post("/park_then_read", { onRequest: park, onSend: record }, increment);
  }
}

let app: FastifyInstance | undefined;
afterEach(async () => {
  await app?.close();
  app = undefined;
});

async function start(): Promise<{ server: GatedServer; kind: ResourcesKind; base: string; cookie: string; sessionId: string }> {
  const server = new GatedServer();
  const built = await createResourcesApp(server, { owner: "w0" });
  server.kind = built.kind;
  app = built.app;
  await app.listen({ port: 0, host: "127.0.0.1" });
  const base = `http://127.0.0.1:${(app.server.address() as AddressInfo).port}`;
  const seeded = await fetch(`${base}/ng-rollout/ab-1/seed_session`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
  const cookie = String(seeded.headers.get("set-cookie")).split(";")[0]!;
  return { server, kind: built.kind, base, cookie, sessionId: cookie.split("=")[1]! };
}

/** Sends a POST, waits until the server parked it, then drops the connection (a retire, a deadline). */
async function postAndGiveUp(server: GatedServer, url: string, headers: Record<string, string>, body: string): Promise<void> {
  let client: ClientRequest | undefined;
  const failed = new Promise<void>((resolve) => {
    client = request(url, { method: "POST", headers });
    client.on("error", () => resolve());
    client.end(body);
  });
  await waitUntil(() => server.holding, "the request to be parked");
  client!.destroy();
  await failed;
  await waitUntil(() => server.clientGone, "the server to see the client go");
}

describe("resources: a client that disconnects mid-call", () => {
  it("keeps the call in flight until its handler replies, so retire waits for it", async () => {
    const { server, kind, base, cookie } = await start();
    let client: ClientRequest | undefined;
    const failed = new Promise<void>((resolve) => {
      client = request(`${base}/ng-rollout/ab-1/slow_tool`, { method: "POST", headers: { "content-type": "application/json", cookie } });
      client.on("error", () => resolve());
      client.end("{}");
    });
    await waitUntil(() => server.entered, "the handler to start");
    client!.destroy(); // the caller gives up (its own retire, a deadline)
    await failed;
    expect(kind.readiness().counts.inflight).toBe(1);
    let retired = false;
    const retiring = kind.retire([{ rollout_id: "ab-1", attempt: 0 }]).then(() => (retired = true));
    await new Promise((resolve) => setImmediate(resolve));
    expect(retired).toBe(false); // stop, then free: the handler is still running
    server.release();
    await retiring;
    expect(server.finished).toBe(true);
    expect(kind.readiness().counts.inflight).toBe(0);
  });

  it("keeps a call whose client left after its body was read in flight: its handler still runs", async () => {
    const { server, kind, base, cookie, sessionId } = await start();
    await postAndGiveUp(server, `${base}/ng-rollout/ab-1/read_then_park`, { "content-type": "application/json", cookie }, "{}");
    // Fastify still runs the handler, which changes the session: a prepare must not read ready.
    expect(kind.readiness().counts.inflight).toBe(1);
    server.open();
    await waitUntil(() => server.replies.length === 1, "the reply");
    expect(server.inflightInHandler).toBe(1);
    expect(server.counters.get(sessionId)).toBe(1);
    expect(kind.readiness().counts.inflight).toBe(0);
  });

  it("releases such a call once its handler resolved nothing: Fastify sends no reply, so no onSend", async () => {
    const { server, kind, base, cookie } = await start();
    await postAndGiveUp(server, `${base}/ng-rollout/ab-1/hold_then_nothing`, { "content-type": "application/json", cookie }, "{}");
    expect(kind.readiness().counts.inflight).toBe(1);
    let retired = false;
    const retiring = kind.retire([{ rollout_id: "ab-1", attempt: 0 }]).then(() => (retired = true));
    server.open();
    await waitUntil(() => server.finished, "the handler to finish");
    await waitUntil(() => retired, "the retire to stop waiting for the call", 2000);
    await retiring;
    expect(kind.readiness()).toMatchObject({ blockers: [], counts: { inflight: 0, sessions: 0 } });
  });

  it("releases a call whose handler hijacked the reply", async () => {
    const { kind, base, cookie } = await start();
    const reply = await fetch(`${base}/ng-rollout/ab-1/hijacked`, { method: "POST", headers: { "content-type": "application/json", cookie }, body: "{}" });
    expect(await reply.json()).toEqual({});
    await waitUntil(() => kind.readiness().counts.inflight === 0, "the hijacked call to be released", 2000);
    expect(kind.readiness().blockers).toEqual([]);
  });

  it("keeps a call whose handler hijacked the reply in flight until its raw response is done", async () => {
    const { server, kind, base, cookie } = await start();
    const reply = fetch(`${base}/ng-rollout/ab-1/hijacked_later`, { method: "POST", headers: { "content-type": "application/json", cookie }, body: "{}" });
    await waitUntil(() => server.holding, "the hijacking handler to run", 2000);
    await new Promise((resolve) => setImmediate(resolve));
    expect(kind.readiness().counts.inflight).toBe(1); // its handler still writes: a prepare must wait
    server.open();
    expect(await (await reply).json()).toEqual({});
    await waitUntil(() => kind.readiness().counts.inflight === 0, "the hijacked call to be released", 2000);
  });

  it("refuses such a call with stale_attempt once its session was retired; the retire waits for it", async () => {
    const { server, kind, base, cookie, sessionId } = await start();
    await postAndGiveUp(server, `${base}/ng-rollout/ab-1/read_then_park`, { "content-type": "application/json", cookie }, "{}");
    let retired = false;
    const retiring = kind.retire([{ rollout_id: "ab-1", attempt: 0 }]).then(() => (retired = true));
    await new Promise((resolve) => setImmediate(resolve));
    expect(retired).toBe(false); // stop first: the request may still reach its handler
    server.open();
    await retiring;
    expect(server.entered).toBe(false);
    expect(server.replies).toHaveLength(1);
    expect(server.replies[0]!.status).toBe(409);
    expect(JSON.parse(server.replies[0]!.body).error.code).toBe("stale_attempt");
    expect(server.counters.has(sessionId)).toBe(false); // freed, not written again
    expect(kind.readiness().counts).toMatchObject({ inflight: 0, sessions: 0 });
  });

  it("releases a call whose client left before its request was read; it never runs", async () => {
    const { server, kind, base, cookie, sessionId } = await start();
    // With a body: Fastify never reads it from the closed socket, so no onSend would release it.
    await postAndGiveUp(server, `${base}/ng-rollout/ab-1/park_then_read`, { "content-type": "application/json", cookie }, "{}");
    expect(kind.readiness().counts.inflight).toBe(0);
    server.holding = server.clientGone = false;
    // No body: Fastify would go on to the handler, so the request is refused on the way.
    await postAndGiveUp(server, `${base}/ng-rollout/ab-1/park_then_read`, { cookie, "content-length": "0" }, "");
    expect(kind.readiness().counts.inflight).toBe(0);
    server.open();
    await waitUntil(() => server.replies.length === 1, "the reply");
    expect(JSON.parse(server.replies[0]!.body).error.code).toBe("admission_closed");
    expect(server.entered).toBe(false);
    expect(server.counters.get(sessionId)).toBe(0);
    expect(kind.readiness().counts.inflight).toBe(0);
  });
});

describe("resources: a streamed reply", () => {
  // A failed test leaves its stream open, which app.close() would wait for.
  afterEach(() => app?.server.closeAllConnections());

  /** Starts a streamed call and resolves once its first event arrived (Fastify ran onSend). */
  async function streaming(base: string, cookie: string, server: GatedServer, route = "streamed") {
    let received = "";
    let client: ClientRequest | undefined;
    const ended = new Promise<string>((resolve) => {
      client = request(`${base}/ng-rollout/ab-1/${route}`, { method: "POST", headers: { "content-type": "application/json", cookie } }, (response) => {
        response.on("data", (chunk) => (received += String(chunk)));
        response.on("end", () => resolve(received));
        response.on("error", () => resolve(received));
      });
      client.on("error", () => resolve(received));
      client.end("{}");
    });
    server.events.push("data: 1\n\n");
    await waitUntil(() => received.length > 0, "the first event");
    return { ended, client: client! };
  }

  it("stays in flight until its stream ended, so a prepare or retire waits for it", async () => {
    const { server, kind, base, cookie } = await start();
    const { ended } = await streaming(base, cookie, server);
    expect(kind.readiness()).toMatchObject({ blockers: ["ab-1"], counts: { inflight: 1 } }); // its handler still writes
    let retired = false;
    const retiring = kind.retire([{ rollout_id: "ab-1", attempt: 0 }]).then(() => (retired = true));
    await new Promise((resolve) => setImmediate(resolve));
    expect(retired).toBe(false);
    server.events.push("data: 2\n\n");
    server.events.push(null);
    expect(await ended).toBe("data: 1\n\ndata: 2\n\n");
    await retiring;
    expect(kind.readiness()).toMatchObject({ blockers: [], counts: { inflight: 0, sessions: 0 } });
  });

  it("is released when its client leaves mid-stream", async () => {
    const { server, kind, base, cookie } = await start();
    const { ended, client } = await streaming(base, cookie, server);
    expect(kind.readiness().counts.inflight).toBe(1);
    client.destroy();
    await ended;
    await waitUntil(() => server.clientGone, "the server to see the client go");
    await waitUntil(() => kind.readiness().counts.inflight === 0, "the streamed call to be released");
  });

  it("a 2xx streamed terminal step whose handler calls sessions.ended while it streams ends the session", async () => {
    const { server, kind, base, cookie } = await start();
    expect(kind.readiness().counts.sessions).toBe(1);
    const { ended } = await streaming(base, cookie, server, "streamed_terminal");
    server.endSession!(); // after onSend: the reply is a 200
    server.events.push(null);
    await ended;
    await waitUntil(() => kind.readiness().counts.inflight === 0, "the streamed call to be released");
    expect(kind.readiness().counts.sessions).toBe(0);
  });

  // Node closes only the response attached to a dying connection: a streamed reply queued behind
  // another (pipelined) never heard 'close', so its call stayed in flight for good, and a retire (or
  // a prepare) of its episode waited for it until its deadline.
  it("is released when the connection of a call pipelined behind a slow one dies", async () => {
    const { server, kind, base, cookie } = await start();
    let connectionClosed = false;
    app!.server.once("connection", (connection: Socket) => connection.once("close", () => (connectionClosed = true)));
    const socket = connect(Number(new URL(base).port), "127.0.0.1");
    socket.on("error", () => undefined);
    const post = (route: string) => `POST /ng-rollout/ab-1/${route} HTTP/1.1\r\nHost: r\r\nContent-Type: application/json\r\nCookie: ${cookie}\r\nContent-Length: 2\r\n\r\n{}`;
    socket.write(post("slow_tool") + post("streamed"));
    // The streamed reply is piped into its response, which waits unattached behind the slow call's.
    await waitUntil(() => server.entered && server.events.readableFlowing === true, "both calls to run");
    expect(kind.readiness().counts.inflight).toBe(2);
    socket.destroy();
    // Released only once the server saw the connection die: it answers to a dead socket, so the
    // queued reply never gets the connection.
    await waitUntil(() => connectionClosed, "the server to see the connection close");
    server.release();
    let timer: NodeJS.Timeout | undefined;
    const retired = await Promise.race([
      kind.retire([{ rollout_id: "ab-1", attempt: 0 }]).then(() => true),
      new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), 3_000))),
    ]);
    clearTimeout(timer);
    expect(retired).toBe(true);
    expect(kind.readiness().counts.inflight).toBe(0);
  });
});
