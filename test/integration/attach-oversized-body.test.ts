import { mkdtemp } from "node:fs/promises";
import { createServer, request, type Server } from "node:http";
import { connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";

// A generation body over the limit is refused 413, and the rest of it was read and dropped with no
// cap: a client that never ends its body (chunked) kept the connection, read for ever, busy.
const LIMIT = 4096;
/** The proxy's finishWaitMs, also how long a refused body's rest is waited for. */
const FINISH_WAIT_MS = 1000;
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: URL;
let kind: ModelKind;
let upstreamCalls = 0;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-oversized-body-"));
  upstreamCalls = 0;
  upstream = createServer((req, res) => {
    upstreamCalls += 1;
    req.resume();
    res.end("{}");
  });
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(await listenLocal(upstream)), kind, controlToken: "t", maxBodyBytes: LIMIT, finishWaitMs: FINISH_WAIT_MS });
  proxyUrl = new URL(await listenLocal(proxy));
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

const HEAD = "POST /ng-rollout/k/v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";

/** Streams a chunked body without end on `socket` until the proxy closes it or `bound` bytes are sent; the bytes sent. */
async function streamUntilClosed(socket: Socket, bound: number): Promise<number> {
  const piece = `4000\r\n${"x".repeat(0x4000)}\r\n`;
  let sent = 0;
  while (!socket.destroyed && !socket.writableEnded && sent < bound) {
    if (!socket.write(piece)) await new Promise((resolve) => (socket.once("drain", resolve), socket.once("close", resolve)));
    sent += 0x4000;
  }
  return sent;
}

it("answers a body that never ends 413 and closes its connection once it is past five times the limit", async () => {
  const socket = connect(Number(proxyUrl.port), proxyUrl.hostname);
  let reply = "";
  let closed = false;
  socket.setEncoding("utf8");
  socket.on("data", (chunk: string) => (reply += chunk));
  socket.on("error", () => undefined); // EPIPE / ECONNRESET: the proxy closed it under our writes
  socket.on("close", () => (closed = true));
  await new Promise((resolve) => socket.once("connect", resolve));
  socket.write(HEAD);
  const bound = 64 * 1024 * 1024;
  const sent = await streamUntilClosed(socket, bound);
  socket.destroy();
  expect(reply.split("\r\n")[0]).toBe("HTTP/1.1 413 Payload Too Large");
  expect(JSON.parse(reply.slice(reply.indexOf("\r\n\r\n") + 4))).toMatchObject({ error: { code: "payload_too_large" } });
  expect({ closedByProxy: sent < bound }).toEqual({ closedByProxy: true });
  expect(closed).toBe(true);
  expect(upstreamCalls).toBe(0);
  expect(kind.tickets.size).toBe(0);
}, 60_000);

it("keeps an ordinary client's 413 readable: a body a little over the limit is drained, and the connection kept", async () => {
  const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "x".repeat(LIMIT + LIMIT / 2) }] });
  const answer = await new Promise<{ status: number; text: string; reused: boolean }>((resolve, reject) => {
    const req = request(`${proxyUrl.origin}/ng-rollout/k/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (text += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, text, reused: res.headers.connection !== "close" }));
    });
    req.on("error", reject);
    req.end(body);
  });
  expect(answer.status).toBe(413);
  expect(JSON.parse(answer.text)).toMatchObject({ error: { code: "payload_too_large" } });
  expect(answer.reused).toBe(true);
});

it("answers a client that sends its whole body first 413 (httpx, openai-python), up to five times the limit", async () => {
  const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "x".repeat(LIMIT * 4) }] });
  const socket = connect(Number(proxyUrl.port), proxyUrl.hostname);
  let reply = "";
  socket.setEncoding("utf8");
  socket.on("data", (chunk: string) => (reply += chunk));
  await new Promise((resolve) => socket.once("connect", resolve));
  socket.write(`POST /ng-rollout/k/v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: ${body.length}\r\n\r\n${body}`);
  await new Promise<void>((resolve, reject) => {
    socket.on("data", () => reply.endsWith("}") && resolve());
    socket.on("close", () => reject(new Error(`closed after ${JSON.stringify(reply.slice(0, 200))}`)));
  });
  socket.destroy();
  expect(reply.split("\r\n")[0]).toBe("HTTP/1.1 413 Payload Too Large");
});

it("answers fetch 413 for a body several times the limit", async () => {
  const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "x".repeat(LIMIT * 4) }] });
  const response = await fetch(`${proxyUrl.origin}/ng-rollout/k/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" }, body });
  expect(response.status).toBe(413);
  expect(await response.json()).toMatchObject({ error: { code: "payload_too_large" } });
});

it("closes the connection of a refused body whose rest, under the drain cap, trickles in past finishWaitMs", async () => {
  // The server has no requestTimeout (a held call's pipelined requests), and keep-alive's idle timer
  // restarts with every byte: a refused body still owed, sent slowly, held its connection for ever.
  const socket = connect(Number(proxyUrl.port), proxyUrl.hostname);
  let reply = "";
  socket.setEncoding("utf8");
  socket.on("data", (chunk: string) => (reply += chunk));
  socket.on("error", () => undefined);
  const closed = new Promise<"closed">((resolve) => socket.once("close", () => resolve("closed")));
  await new Promise((resolve) => socket.once("connect", resolve));
  const started = Date.now();
  socket.write(`POST /ng-rollout/k/v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nContent-Length: ${LIMIT * 2}\r\n\r\n${"x".repeat(LIMIT + 1)}`);
  // One byte every 200 ms: well inside keep-alive's 5 s idle timeout, and far from the body's end.
  const trickle = setInterval(() => socket.destroyed || socket.write("x"), 200);
  let bound: NodeJS.Timeout | undefined;
  const outcome = await Promise.race([closed, new Promise<"still open">((resolve) => (bound = setTimeout(() => resolve("still open"), FINISH_WAIT_MS + 10_000)))]);
  clearInterval(trickle);
  clearTimeout(bound);
  socket.destroy();
  expect(reply.split("\r\n")[0]).toBe("HTTP/1.1 413 Payload Too Large");
  expect(outcome).toBe("closed");
  expect(Date.now() - started).toBeGreaterThanOrEqual(FINISH_WAIT_MS - 50); // not cut at once: a client still sending gets its time
  expect(upstreamCalls).toBe(0);
}, 30_000);
