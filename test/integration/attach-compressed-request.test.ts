import { mkdtemp } from "node:fs/promises";
import { createServer, request, type IncomingHttpHeaders, type Server } from "node:http";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { brotliCompressSync, deflateRawSync, deflateSync, gzipSync } from "node:zlib";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";

// A generation call whose body came compressed (`Content-Encoding: gzip`, from a client that compresses
// its requests) was refused `400 invalid_request` "the request body is not JSON": the proxy parsed the
// coded bytes. And a caller's `transfer_encoding` / `content_length` headers (a WSGI upstream's
// HTTP_TRANSFER_ENCODING / HTTP_CONTENT_LENGTH, as the dashed ones) went upstream.
const LIMIT = 4096;
const CHAT = JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] });
const COMPLETION = '{"choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}';
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: URL;
let kind: ModelKind;
let calls: { url: string; headers: IncomingHttpHeaders; rawHeaders: string[]; body: Buffer }[];

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-compressed-request-"));
  calls = [];
  upstream = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (chunk: Buffer) => chunks.push(chunk));
    req.on("end", () => {
      calls.push({ url: req.url ?? "", headers: req.headers, rawHeaders: req.rawHeaders, body: Buffer.concat(chunks) });
      res.writeHead(200, { "content-type": "application/json" }).end(COMPLETION);
    });
  });
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(await listenLocal(upstream)), kind, controlToken: "t", maxBodyBytes: LIMIT });
  proxyUrl = new URL(await listenLocal(proxy));
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

/** POSTs `body` to `path` on the proxy with `headers`; the answer read whole. */
function post(path: string, headers: Record<string, string>, body: Buffer | string): Promise<{ status: number; body: string; headers: IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    const req = request(`${proxyUrl.origin}${path}`, { method: "POST", headers: { "content-type": "application/json", ...headers } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (text += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text, headers: res.headers }));
      res.on("error", reject);
    });
    req.on("error", reject);
    req.end(body);
  });
}

const chat = (key: string) => `/ng-rollout/${key}/v1/chat/completions`;

it("tracks a generation call whose body is gzip, deflate (zlib or raw) or br coded, forwarding its bytes with their Content-Encoding", async () => {
  const coded: [string, string, Buffer][] = [
    ["gz", "gzip", gzipSync(CHAT)],
    ["xgz", "x-gzip", gzipSync(CHAT)],
    ["zl", "deflate", deflateSync(CHAT)],
    ["raw", "deflate", deflateRawSync(CHAT)],
    ["br", "br", brotliCompressSync(CHAT)],
    ["two", "gzip, br", brotliCompressSync(gzipSync(CHAT))],
    ["id", "identity", Buffer.from(CHAT)],
  ];
  for (const [key, coding, body] of coded) {
    const { status, body: text } = await post(chat(key), { "content-encoding": coding }, body);
    expect({ key, status, text }).toEqual({ key, status: 200, text: COMPLETION });
    expect((await kind.ledger.rows(key)).map((row) => row.route)).toEqual(["/v1/chat/completions"]);
    const sent = calls.at(-1)!;
    expect(sent.headers["content-encoding"]).toBe(coding);
    expect(sent.body.equals(body)).toBe(true);
  }
});

it("tracks a generation call whose body is sent Transfer-Encoding: gzip, chunked", async () => {
  const gzipped = gzipSync(CHAT);
  const socket = connect(Number(proxyUrl.port), proxyUrl.hostname);
  let reply = "";
  socket.setEncoding("utf8");
  socket.on("data", (chunk: string) => (reply += chunk));
  socket.on("error", () => undefined);
  await new Promise((resolve) => socket.once("connect", resolve));
  socket.write(`POST ${chat("te")} HTTP/1.1\r\nHost: a\r\nContent-Type: application/json\r\nTransfer-Encoding: gzip, chunked\r\n\r\n${gzipped.length.toString(16)}\r\n`);
  socket.write(gzipped);
  socket.write("\r\n0\r\n\r\n");
  await new Promise((resolve) => socket.once("data", resolve));
  socket.destroy();
  expect(reply).toMatch(/^HTTP\/1\.1 200 /);
  expect((await kind.ledger.rows("te")).length).toBe(1);
  expect(calls[0]!.headers["content-encoding"]).toBe("gzip");
  expect(calls[0]!.body.equals(gzipped)).toBe(true);
});

it("refuses a coded body whose decoded size is past the limit 413 payload_too_large, though its coded bytes are within it", async () => {
  const bomb = gzipSync(JSON.stringify({ model: "m", messages: [{ role: "user", content: "a".repeat(LIMIT * 50) }] }));
  expect(bomb.length).toBeLessThan(LIMIT);
  const answer = await post(chat("bomb"), { "content-encoding": "gzip" }, bomb);
  expect(answer.status).toBe(413);
  expect(JSON.parse(answer.body).error).toEqual({ code: "payload_too_large", detail: expect.stringContaining(`decoded request body larger than ${LIMIT} bytes`) });
  // Each coding's output is bounded, not just the last one's.
  const nested = brotliCompressSync(gzipSync(Buffer.alloc(LIMIT * 50, 0x20)));
  const twice = await post(chat("bomb2"), { "content-encoding": "gzip, br" }, nested);
  expect(JSON.parse(twice.body).error.code).toBe("payload_too_large");
  // Raw deflate (read after its zlib reading fails) too.
  const raw = await post(chat("bomb3"), { "content-encoding": "deflate" }, deflateRawSync(Buffer.alloc(LIMIT * 50, 0x20)));
  expect(JSON.parse(raw.body).error.code).toBe("payload_too_large");
  expect(calls).toEqual([]);
});

// RFC 9110 §15.5.16: a content coding the server does not take is 415, its Accept-Encoding listing those it does.
it("refuses a body in a coding it cannot decode 415 unsupported_content_coding naming the coding, its Accept-Encoding listing those it decodes", async () => {
  for (const [key, coding] of [["zstd", "zstd"], ["mixed", "gzip, compress"]] as const) {
    const unknown = await post(chat(key), { "content-encoding": coding }, Buffer.from([0x28, 0xb5, 0x2f, 0xfd]));
    expect(unknown.status).toBe(415);
    expect(unknown.headers["accept-encoding"]).toBe("gzip, deflate, br");
    expect(JSON.parse(unknown.body).error).toEqual({ code: "unsupported_content_coding", detail: expect.stringMatching(/coding "(zstd|compress)" \(Content-Encoding, or Transfer-Encoding/) });
  }
  expect(calls).toEqual([]);
  // An untracked call's body is never read here: forwarded as it came, its coding named unchanged.
  const zstd = Buffer.from([0x28, 0xb5, 0x2f, 0xfd, 0x01]);
  expect((await post("/v1/files", { "content-encoding": "zstd" }, zstd)).status).toBe(200);
  expect(calls.map(({ url, headers, body }) => ({ url, coding: headers["content-encoding"], body }))).toEqual([{ url: "/v1/files", coding: "zstd", body: zstd }]);
});

it("refuses a body broken in its coding, or in too many codings, 400 invalid_request naming the coding, not 'not JSON'", async () => {
  const broken = await post(chat("broken"), { "content-encoding": "gzip" }, gzipSync(CHAT).subarray(0, 12));
  expect(broken.status).toBe(400);
  expect(JSON.parse(broken.body).error).toEqual({ code: "invalid_request", detail: expect.stringContaining("not valid gzip") });
  const many = await post(chat("many"), { "content-encoding": "gzip, gzip, gzip, gzip, gzip" }, gzipSync(CHAT));
  expect(JSON.parse(many.body).error).toEqual({ code: "invalid_request", detail: expect.stringContaining("at most 4 are decoded") });
  // A coded body that is no JSON once decoded is still "not JSON".
  const notJson = await post(chat("nj"), { "content-encoding": "gzip" }, gzipSync("hello"));
  expect(JSON.parse(notJson.body).error.detail).toBe("the request body is not JSON");
  expect(calls).toEqual([]);
});

// A WSGI/CGI upstream maps `transfer_encoding` and `Transfer-Encoding` to one variable, HTTP_TRANSFER_ENCODING
// (likewise content_length, content_encoding): a caller's underscore spelling passed for, or overrode, the
// header the proxy sets or drops.
it("drops a caller's underscore spellings of the headers the proxy handles itself, on a generation call and a passthrough", async () => {
  const spelled = { transfer_encoding: "chunked", content_length: "5", Proxy_Authorization: "Basic eDp5", keep_alive: "timeout=5", content_encoding: "gzip", accept_encoding: "gzip", x_kept: "1" };
  expect((await post(chat("us"), spelled, CHAT)).status).toBe(200);
  expect((await post("/v1/files", spelled, "abc")).status).toBe(200);
  const [tracked, passed] = calls.map((call) => call.rawHeaders.filter((_, i) => i % 2 === 0 && call.rawHeaders[i]!.includes("_")));
  expect(tracked).toEqual(["x_kept"]);
  // Untracked: the caller's accept-encoding goes on as it came, so its underscore spelling does too.
  expect(passed).toEqual(["accept_encoding", "x_kept"]);
  expect(calls[0]!.headers["accept-encoding"]).toBe("identity");
  expect(calls[1]!.body.toString()).toBe("abc");
});

// A proxy drops every header a Connection header names (RFC 9110 §7.6.1). Dropping Content-Encoding (or
// Content-Type) would send the body on without what says how to read it: the upstream would read the
// gzip bytes the proxy decoded and tracked as plain JSON. Such a request is refused instead.
it("refuses a request whose Connection names Content-Encoding or Content-Type 400 invalid_request naming the header, sending nothing upstream", async () => {
  const gzipped = gzipSync(CHAT);
  const named: [string, string, Record<string, string>][] = [
    ["ce", chat("ce"), { connection: "keep-alive, Content-Encoding", "content-encoding": "gzip" }],
    ["us", chat("us"), { connection: "content_encoding", "content-encoding": "gzip" }],
    ["ct", chat("ct"), { connection: "content-type", "content-encoding": "gzip" }],
    ["pass", "/v1/files", { connection: "content-encoding", "content-encoding": "gzip" }],
  ];
  for (const [key, path, headers] of named) {
    const answer = await post(path, headers, gzipped);
    expect({ key, status: answer.status }).toEqual({ key, status: 400 });
    expect(JSON.parse(answer.body).error).toEqual({ code: "invalid_request", detail: expect.stringMatching(/Connection header names Content-(Encoding|Type)/) });
    expect(await kind.ledger.rows(key)).toEqual([]);
  }
  expect(calls).toEqual([]);
  // Another header named there is still dropped as an option of the connection, the call tracked.
  expect((await post(chat("other"), { connection: "x-hop", "x-hop": "1", "content-encoding": "gzip" }, gzipped)).status).toBe(200);
  expect(calls[0]!.headers["x-hop"]).toBeUndefined();
  expect(calls[0]!.headers["content-encoding"]).toBe("gzip");
});
