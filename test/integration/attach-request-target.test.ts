import { mkdtemp } from "node:fs/promises";
import { createServer, request, type IncomingHttpHeaders, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";

// The proxy reads a request target as the upstream (uvicorn's httptools parser, vLLM's server) does.
// A fragment (`#...`, which origin-form does not allow but Node's parser accepts) ends the path there,
// so a generation call spelled so is tracked like any other spelling, not passed through untracked.
// An absolute-form target (`http://host/path`: what a client configured with the proxy as its HTTP
// proxy sends, and what a server must accept, RFC 9112 §3.2.2) is read by its path: the ledger API's
// control token must never go upstream, and a prefixed generation call must be tracked.
const TOKEN = "absolute-form-secret";
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;
let seen: { url: string; headers: IncomingHttpHeaders }[] = [];

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-request-target-"));
  seen = [];
  upstream = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      seen.push({ url: req.url ?? "", headers: req.headers });
      const body = JSON.stringify({ choices: [{ message: { content: "hi" } }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } });
      res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(body) }).end(body);
    });
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/v1`), kind, controlToken: TOKEN });
  proxyUrl = await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

const CHAT_BODY = JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] });

/** A request with its request target sent exactly as given. */
function raw(method: string, target: string, body?: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(`${proxyUrl}/`, { method, headers: { "content-type": "application/json", authorization: `Bearer ${TOKEN}` } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (text += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.path = target;
    req.on("error", reject);
    req.end(body);
  });
}

it("serves an absolute-form ledger API call itself and never forwards its control token upstream", async () => {
  // Whatever host it names: the proxy is the one asked.
  for (const target of [`${proxyUrl}/ng-capture/v1/status`, "http://elsewhere/ng-capture/v1/status?q=1"]) {
    const status = await raw("GET", target);
    expect([target, status.status]).toEqual([target, 200]);
    expect(JSON.parse(status.body)).toMatchObject({ blockers: [], counts: { inflight: 0, held: 0 } });
  }
  // Near misses in absolute-form are refused like any other spelling.
  for (const target of ["http://elsewhere//NG-CAPTURE/v1/status", "HTTP://elsewhere/ng-rollout/k/ng-capture/v2/x?q=1", "http://elsewhere/ng-capture"]) {
    expect([target, (await raw("GET", target)).status]).toEqual([target, 404]);
  }
  expect(seen).toEqual([]);
});

it("tracks an absolute-form generation call like its origin-form spelling", async () => {
  const answer = await raw("POST", `${proxyUrl}/ng-rollout/abs/v1/chat/completions?x=1`, JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }));
  expect(answer.status).toBe(200);
  expect(seen.map((s) => [s.url, typeof s.headers["x-ng-model-call-id"]])).toEqual([["/v1/chat/completions?x=1", "string"]]);
  expect((await kind.ledger.rows("abs")).map((r) => r.route)).toEqual(["/v1/chat/completions"]);
  // Without the prefix it is refused, as any unprefixed generation call is.
  expect((await raw("POST", "http://elsewhere/v1/chat/completions", "{}")).status).toBe(400);
});

it("refuses an asterisk-form target with invalid_request, without blaming the upstream it never reached", async () => {
  const answer = await raw("OPTIONS", "*");
  expect(answer.status).toBe(400);
  expect(JSON.parse(answer.body)).toMatchObject({ error: { code: "invalid_request" } });
  expect(seen).toEqual([]);
});

it("tracks a generation call whose request target carries a fragment", async () => {
  for (const target of ["/ng-rollout/frag/v1/chat/completions#x", "/ng-rollout/frag/v1/chat/completions#x?y=1", "/ng-rollout/frag/v1/chat/completions?y=1#x"]) {
    expect([target, (await raw("POST", target, CHAT_BODY)).status]).toEqual([target, 200]);
  }
  // Each was forwarded as a tracked call (with its lineage headers) and has its row.
  expect(seen.map((s) => typeof s.headers["x-ng-model-call-id"])).toEqual(["string", "string", "string"]);
  const rows = await kind.ledger.rows("frag");
  expect(rows.map((r) => r.route)).toEqual(["/v1/chat/completions", "/v1/chat/completions", "/v1/chat/completions"]);
  // Without the prefix it is refused, as any unprefixed generation call is.
  expect((await raw("POST", "/v1/chat/completions#x", CHAT_BODY)).status).toBe(400);
});

it("classifies a route behind a path prefix by its end: chat completions tracked, legacy completions passed through", async () => {
  // Legacy /v1/completions is no generation route (the protocol gates chat completions, responses and
  // messages only), with or without a path before /v1: both spellings of each are classified alike.
  for (const target of ["/ng-rollout/pre/v1/chat/completions", "/ng-rollout/pre/something/v1/chat/completions"]) {
    expect([target, (await raw("POST", target, CHAT_BODY)).status]).toEqual([target, 200]);
  }
  const prompt = JSON.stringify({ model: "m", prompt: "hi" });
  for (const target of ["/ng-rollout/pre/v1/completions", "/ng-rollout/pre/something/v1/completions", "/something/v1/completions"]) {
    expect([target, (await raw("POST", target, prompt)).status]).toEqual([target, 200]);
  }
  expect(seen.map((s) => [s.url, typeof s.headers["x-ng-model-call-id"]])).toEqual([
    ["/v1/chat/completions", "string"],
    ["/something/v1/chat/completions", "string"],
    ["/v1/completions", "undefined"],
    ["/something/v1/completions", "undefined"],
    ["/something/v1/completions", "undefined"],
  ]);
  expect((await kind.ledger.rows("pre")).map((r) => r.route)).toEqual(["/v1/chat/completions", "/something/v1/chat/completions"]);
});
