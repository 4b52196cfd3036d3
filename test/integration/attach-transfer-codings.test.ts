import { mkdtemp } from "node:fs/promises";
import { createServer, request, type IncomingHttpHeaders, type Server } from "node:http";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gunzipSync, gzipSync } from "node:zlib";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";

// Only `chunked` of a `Transfer-Encoding` belongs to the hop: the body still carries the other codings
// (`gzip, chunked`) once unchunked. The proxy dropped the whole header both ways, so the far side got
// gzip bytes it was never told were compressed.
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: URL;
let kind: ModelKind;
let received: (call: { headers: IncomingHttpHeaders; body: Buffer }) => void;
let upstreamCall: Promise<{ headers: IncomingHttpHeaders; body: Buffer }>;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-transfer-codings-"));
  upstreamCall = new Promise((resolve) => (received = resolve));
  upstream = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      received({ headers: req.headers, body: Buffer.concat(chunks) });
      if (req.url === "/v1/gzipped") return void res.writeHead(200, { "content-type": "text/plain", "transfer-encoding": "gzip, chunked" }).end(gzipSync("hello from upstream"));
      res.end("{}");
    });
  });
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(await listenLocal(upstream)), kind, controlToken: "t" });
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
