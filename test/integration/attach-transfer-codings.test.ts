import { mkdtemp } from "node:fs/promises";
import { createServer, request, type IncomingHttpHeaders, type Server } from "node:http";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { gunzipSync, gzipSync } from "node:zlib";
import { pino } from "pino";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";

// Only `chunked` of a `Transfer-Encoding` belongs to the hop: the body still carries the other codings
// (`gzip, chunked`) once unchunked. Dropping the whole header, either way, would hand the far side gzip
// bytes it was never told were compressed.
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: URL;
let kind: ModelKind;
let received: (call: { headers: IncomingHttpHeaders; body: Buffer }) => void;
let upstreamCall: Promise<{ headers: IncomingHttpHeaders; body: Buffer }>;
let lines: { level: number; msg: string; [field: string]: unknown }[];

/** `chunked, gzip`: chunk-framed, then gzipped. Chunked is not the last coding, so the body runs to the connection's close, never de-chunked. */
const UNFRAMED_BODY = gzipSync("5\r\nhello\r\n0\r\n\r\n");
const COMPLETION = '{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}';

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-transfer-codings-"));
  upstreamCall = new Promise((resolve) => (received = resolve));
  upstream = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      received({ headers: req.headers, body: Buffer.concat(chunks) });
      if (req.url === "/v1/gzipped") return void res.writeHead(200, { "content-type": "text/plain", "transfer-encoding": "gzip, chunked" }).end(gzipSync("hello from upstream"));
      if (req.url === "/v1/unframed") {
        // Written by hand: Node's server would frame a body itself under any Transfer-Encoding naming chunked.
        const head = "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nTransfer-Encoding: chunked, gzip\r\nConnection: close\r\n\r\n";
        return void req.socket.end(Buffer.concat([Buffer.from(head), UNFRAMED_BODY]));
      }
      // An answer whose Connection names the header given in `x-test-named` (and, for `x-hop`, sends it too).
      const named = req.headers["x-test-named"];
      if (typeof named === "string") {
        const hop = named === "x-hop" ? { "x-hop": "1" } : {};
        return void res.writeHead(200, { connection: `keep-alive, ${named}`, "content-type": "application/json", "content-encoding": "gzip", ...hop }).end(gzipSync(COMPLETION));
      }
      if (req.url === "/v1/chat/completions") {
        const coding = req.headers["x-test-coding"];
        if (coding === "content") return void res.writeHead(200, { "content-type": "application/json", "content-encoding": "gzip" }).end(gzipSync(COMPLETION));
        if (coding === "transfer") return void res.writeHead(200, { "content-type": "application/json", "transfer-encoding": "gzip, chunked" }).end(gzipSync(COMPLETION));
        return void res.writeHead(200, { "content-type": "application/json" }).end(COMPLETION);
      }
      res.end("{}");
    });
  });
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  lines = [];
  const logger = pino({ level: "debug" }, new Writable({ write: (chunk: Buffer, _enc, done) => (lines.push(JSON.parse(chunk.toString())), done()) }));
  proxy = createAttachProxy({ upstream: parseUpstream(await listenLocal(upstream)), kind, controlToken: "t", logger });
  proxyUrl = new URL(await listenLocal(proxy));
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

it("forwards a request body sent with Transfer-Encoding: gzip, chunked with its gzip coding", async () => {
  const gzipped = gzipSync("hello from the caller");
  const socket = connect(Number(proxyUrl.port), proxyUrl.hostname);
  socket.on("error", () => undefined);
  await new Promise((resolve) => socket.once("connect", resolve));
  socket.write(`POST /v1/files HTTP/1.1\r\nHost: a\r\nContent-Type: text/plain\r\nTransfer-Encoding: gzip, chunked\r\n\r\n${gzipped.length.toString(16)}\r\n`);
  socket.write(gzipped);
  socket.write("\r\n0\r\n\r\n");
  const call = await upstreamCall;
  socket.destroy();
  expect(call.headers["content-encoding"]).toBe("gzip");
  expect(gunzipSync(call.body).toString("utf8")).toBe("hello from the caller");
});

it("answers a response sent with Transfer-Encoding: gzip, chunked with its gzip coding", async () => {
  const answer = await new Promise<{ status: number; headers: IncomingHttpHeaders; body: Buffer }>((resolve, reject) => {
    const req = request(`${proxyUrl.origin}/v1/gzipped`, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
    });
    req.on("error", reject);
    req.end();
  });
  expect(answer.status).toBe(200);
  expect(answer.headers["content-encoding"]).toBe("gzip");
  expect(gunzipSync(answer.body).toString("utf8")).toBe("hello from upstream");
});

/** A call to the proxy, its answer read whole (as bytes: no decoding). */
function call(path: string, options: { method?: string; headers?: Record<string, string>; body?: string } = {}): Promise<{ status: number; headers: IncomingHttpHeaders; body: Buffer }> {
  return new Promise((resolve, reject) => {
    const req = request(`${proxyUrl.origin}${path}`, { method: options.method ?? "GET", headers: options.headers }, (res) => {
      const chunks: Buffer[] = [];
      res.on("data", (chunk: Buffer) => chunks.push(chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks) }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(options.body);
  });
}

// `Transfer-Encoding: chunked, gzip` (chunked not last) was told to the caller as `Content-Encoding: gzip`,
// though the body, read to the connection's close, still carries its chunk framing under the gzip.
it("passes an answer whose Transfer-Encoding does not end in chunked on as it came, naming no content coding, and warns once", async () => {
  for (let i = 0; i < 2; i++) {
    const answer = await call("/v1/unframed");
    expect(answer.status).toBe(200);
    expect(answer.headers["content-encoding"]).toBeUndefined();
    expect(answer.body.equals(UNFRAMED_BODY)).toBe(true);
  }
  const warnings = lines.filter((line) => line.level === 40);
  expect(warnings).toEqual([expect.objectContaining({ transfer_encoding: "chunked, gzip" })]);
});

// A tracked call asks for `accept-encoding: identity`; an upstream coding its answer anyway left the row
// without usage, and a stream ending in an error event recorded as a success, with nothing said.
it("warns, naming the coding, when a tracked call's answer comes coded despite accept-encoding: identity, and still answers it", async () => {
  const chat = (key: string, coding?: string) =>
    call(`/ng-rollout/${key}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(coding && { "x-test-coding": coding }) },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
    });
  const plain = await chat("r0");
  expect(plain.body.toString()).toBe(COMPLETION);
  expect(lines.filter((line) => line.level >= 40)).toEqual([]);
  for (const key of ["r1", "r2"]) {
    const answer = await chat(key, "content");
    expect(answer.status).toBe(200);
    expect(answer.headers["content-encoding"]).toBe("gzip");
    expect(gunzipSync(answer.body).toString()).toBe(COMPLETION);
  }
  const answer = await chat("r3", "transfer");
  expect(answer.headers["content-encoding"]).toBe("gzip");
  expect(gunzipSync(answer.body).toString()).toBe(COMPLETION);
  // Once per coding (its repeats at debug), with the capture key of the call that showed it.
  expect(lines.filter((line) => line.level === 40)).toEqual([expect.objectContaining({ coding: "gzip", capture_key: "r1" })]);
  expect(lines.filter((line) => line.level === 20 && line.coding === "gzip").map((line) => line.capture_key)).toEqual(["r2", "r3"]);
});

// A proxy drops every header the answer's Connection names (RFC 9110 §7.6.1); dropping Content-Encoding
// (or Content-Type) there would hand the caller gzip bytes with no coding named. Such an answer is a 502
// naming the header, before any byte of it leaves.
it("answers 502 upstream_failed naming the header when the upstream's Connection names Content-Encoding or Content-Type, tracked or not, with no row", async () => {
  const chat = (key: string, named: string) =>
    call(`/ng-rollout/${key}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", "x-test-named": named },
      body: JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }),
    });
  const answers = [
    ["pass-ce", await call("/v1/models", { headers: { "x-test-named": "Content-Encoding" } })],
    ["pass-ct", await call("/v1/models", { headers: { "x-test-named": "CONTENT-TYPE" } })],
    ["chat-ce", await chat("chat-ce", "content-encoding")],
    ["chat-ct", await chat("chat-ct", "Content-Type")],
  ] as const;
  for (const [key, answer] of answers) {
    expect({ key, status: answer.status, coding: answer.headers["content-encoding"] }).toEqual({ key, status: 502, coding: undefined });
    expect(JSON.parse(answer.body.toString()).error).toEqual({ code: "upstream_failed", detail: expect.stringMatching(/Connection header names Content-(Encoding|Type)/) });
  }
  expect(await kind.ledger.rows("chat-ce")).toEqual([]);
  expect(await kind.ledger.rows("chat-ct")).toEqual([]);
  expect(kind.readiness()).toMatchObject({ blockers: [], counts: { inflight: 0 } });
  // Another header named there is still dropped as an option of that connection, the answer passed on.
  const hop = await chat("hop", "x-hop");
  expect(hop.status).toBe(200);
  expect(hop.headers["x-hop"]).toBeUndefined();
  expect(gunzipSync(hop.body).toString()).toBe(COMPLETION);
  expect((await kind.ledger.rows("hop")).length).toBe(1);
});
