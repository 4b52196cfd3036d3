import { mkdtemp, rm } from "node:fs/promises";
import type { IncomingMessage, Server } from "node:http";
import { connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { HttpControllerApi } from "../../../coordinator/api/http-api.js";
import { waitUntil } from "../../support/wait-until.js";
import { makeEngine, writers } from "./fake-participants.js";

/**
 * The daemon's stop closes the HTTP API (and releases the lease only after that): it waits for the
 * ops being answered, never for a client to give up a connection. One whose op is answered during
 * the stop is closed after that answer (the collector's and the CLI's clients keep theirs alive:
 * Fastify's keep-alive timeout is 72 s); one whose request is still arriving is closed at once
 * (once its server closes, Node no longer times request heads out).
 */
let root: string;
let http: HttpControllerApi | undefined;
let client: Socket | undefined;
const stillStopping = () => new Promise((resolve) => setTimeout(() => resolve("still stopping after 3 s"), 3_000));
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-http-stop-ka-"));
});
afterEach(async () => {
  client?.destroy();
  client = undefined;
  await http?.stop();
  http = undefined;
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/** The API's Node server, to watch its connections and requests. */
function serverOf(api: HttpControllerApi): Server {
  return (api as unknown as { app: { server: Server } }).app.server;
}

/** Whether a new connection to the port is refused (the listener closed). */
function refused(host: string, port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const probe = connect(port, host);
    probe.once("connect", () => {
      probe.destroy();
      resolve(false);
    });
    probe.once("error", () => resolve(true));
  });
}

describe("HTTP API stop: an op running on a kept-alive connection", () => {
  it("is answered, then its connection closes and the stop ends", async () => {
    const { engine, leadership } = makeEngine(root);
    let release!: () => void;
    const status = engine.status.bind(engine);
    engine.status = async () => {
      await new Promise<void>((resolve) => (release = resolve));
      return status();
    };
    http = new HttpControllerApi({ engine, leadership, token: "t" });
    const { hostname, port } = new URL(await http.start());
    let received = "";
    let closed = false;
    client = connect(Number(port), hostname);
    client.on("data", (chunk: Buffer) => (received += chunk.toString("utf8")));
    client.on("close", () => (closed = true));
    client.on("error", () => undefined);
    client.write("GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n");
    await waitUntil(() => release !== undefined, "the op to start");
    const stopping = http.stop();
    // Released once the stop closed the listener (and with it the connections idle then).
    await waitUntil(() => refused(hostname, Number(port)), "the listener to close");
    release();
    await waitUntil(() => received.includes("\r\n\r\n"), "the op's answer");
    expect(received.split("\r\n")[0]).toBe("HTTP/1.1 200 OK");
    // Said so: a client keeping it alive would write its next op on a connection being closed.
    expect(received.toLowerCase()).toContain("\r\nconnection: close\r\n");
    const stopped = await Promise.race([stopping.then(() => "stopped"), stillStopping()]);
    expect(stopped).toBe("stopped");
    // The server's side is gone once the stop ended; the client sees its FIN an event or two later.
    await waitUntil(() => closed, "the connection to close", 1_000);
    http = undefined;
  });

  it.each([
    ["head", "GET /v1/status HTTP/1.1\r\nHost: x\r\n", undefined],
    // Answered: its client learns nothing ran (not_leader, sent again to the successor), where a cut
    // connection after its request left was outcome_unknown to it.
    ["body", 'POST /v1/prepare HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\nContent-Length: 100\r\n\r\n{"checkpoint_id":', "not_leader"],
  ])("closes a connection whose request %s is still arriving (a body one answered not_leader first), runs nothing, and the stop ends", async (_part, partial, answered) => {
    const { engine, leadership, fake } = makeEngine(root);
    http = new HttpControllerApi({ engine, leadership, token: "t" });
    const { hostname, port } = new URL(await http.start());
    const accepted = new Promise<Socket>((resolve) => serverOf(http!).once("connection", resolve));
    let closed = false;
    let received = "";
    client = connect(Number(port), hostname);
    client.on("data", (chunk: Buffer) => (received += chunk.toString("utf8")));
    client.on("close", () => (closed = true));
    client.on("error", () => undefined);
    client.write(partial);
    // For the server to have read it before the stop: unread, the connection would be idle, which
    // the stop closed before too (the test would then not tell). Node's parser reads the socket
    // itself (no 'data' events); bytesRead counts what it was handed.
    const served = await accepted;
    await waitUntil(() => served.bytesRead === Buffer.byteLength(partial), "the server to read the partial request");
    const stopped = await Promise.race([http.stop().then(() => "stopped"), stillStopping()]);
    expect(stopped).toBe("stopped");
    await waitUntil(() => closed, "the connection to close", 1_000);
    if (answered === undefined) expect(received).toBe("");
    else {
      const [refusal] = responses(received);
      expect(refusal!.status).toBe("HTTP/1.1 503 Service Unavailable");
      expect(received.toLowerCase()).toContain("\r\nconnection: close\r\n");
      expect(JSON.parse(refusal!.body)).toMatchObject({ error: { code: answered } });
    }
    expect(fake.calls).toEqual([]);
    http = undefined;
  });
});

/** The responses in `received`, in order: status line and body (each has a Content-Length). */
function responses(received: string): { status: string; head: string; body: string }[] {
  const out: { status: string; head: string; body: string }[] = [];
  let rest = received;
  for (let i = 0; i < 10 && rest.includes("\r\n\r\n"); i++) {
    const end = rest.indexOf("\r\n\r\n");
    const head = rest.slice(0, end);
    const length = Number(/\r\ncontent-length: *(\d+)/i.exec(head)?.[1] ?? 0);
    out.push({ status: head.split("\r\n")[0]!, head, body: rest.slice(end + 4, end + 4 + length) });
    rest = rest.slice(end + 4 + length);
  }
  return out;
}

describe("HTTP API stop: a request that arrives during the stop", () => {
  it("is refused not_leader, the catalog's retry-elsewhere refusal, and runs nothing; /healthz still answers", async () => {
    const { engine, leadership } = makeEngine(root);
    let gate!: () => void;
    const released = new Promise<void>((resolve) => (gate = resolve));
    let running = 0;
    const status = engine.status.bind(engine);
    engine.status = async () => {
      running += 1;
      await released;
      return status();
    };
    let listed = 0;
    const list = engine.list.bind(engine);
    engine.list = async () => {
      listed += 1;
      return list();
    };
    http = new HttpControllerApi({ engine, leadership, token: "t" });
    const { hostname, port } = new URL(await http.start());
    const late = ["/v1/checkpoints", "/readyz", "/healthz"];
    // One connection per late request, each kept open by an op running when the stop begins: the
    // only way a request still reaches the server once its stop began (new connections and idle
    // ones are closed). Sent pipelined behind that op, so its answer queues behind the op's.
    const connections = late.map(() => {
      const socket = connect(Number(port), hostname);
      const seen = { received: "", closed: false };
      socket.on("data", (chunk: Buffer) => (seen.received += chunk.toString("utf8")));
      socket.on("close", () => (seen.closed = true));
      socket.on("error", () => undefined);
      socket.write("GET /v1/status HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n");
      return { socket, seen };
    });
    try {
      await waitUntil(() => running === late.length, "the ops to start");
      const stopping = http.stop();
      await waitUntil(() => refused(hostname, Number(port)), "the listener to close");
      // The ops are let go once the server has read every late request.
      let read = 0;
      serverOf(http).on("request", (req: IncomingMessage) => late.includes(req.url ?? "") && ++read === late.length && gate());
      late.forEach((path, i) => connections[i]!.socket.write(`GET ${path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer t\r\n\r\n`));
      await waitUntil(() => connections.every(({ seen }) => seen.closed), "each connection to close after its last answer");
      const answers = connections.map(({ seen }) => responses(seen.received));
      for (const [first] of answers) expect(first!.status).toBe("HTTP/1.1 200 OK");
      // The op's answer keeps the connection for the refusal pipelined behind it, which closes it.
      for (const { seen } of connections) expect(seen.received.toLowerCase().split("\r\nconnection: close\r\n")).toHaveLength(2);
      const [checkpoints, readyz, healthz] = answers.map((answer) => answer[1]);
      for (const refusal of [checkpoints!, readyz!]) {
        expect(refusal.status).toBe("HTTP/1.1 503 Service Unavailable");
        expect(JSON.parse(refusal.body)).toMatchObject({ error: { code: "not_leader" } });
      }
      // Refused by its route, not before it: named as every /readyz answer is, so a client behind a
      // balancer counts a stopping standby's refusal as that standby's, not as its op's coordinator's.
      const { id, epoch } = leadership.state();
      expect(readyz!.head.toLowerCase()).toContain(`\r\ngym-coordinator-id: ${id}\r\n`);
      expect(readyz!.head.toLowerCase()).toContain(`\r\ngym-coordinator-epoch: ${String(epoch)}\r\n`);
      expect(healthz!.body).toBe('{"ok":true}');
      expect(listed).toBe(0);
      expect(await Promise.race([stopping.then(() => "stopped"), stillStopping()])).toBe("stopped");
      http = undefined;
    } finally {
      for (const { socket } of connections) socket.destroy();
    }
  });
});
