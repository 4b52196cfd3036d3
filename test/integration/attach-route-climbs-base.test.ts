import { mkdtemp } from "node:fs/promises";
import { createServer, request, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";

// An --upstream with a base path (`https://gateway/openai/v1`) puts every route under it. A route whose
// `..` segments climb above its own root (`/../admin`, `/%2e%2e/admin`, `/ng-rollout/<key>/v1/../../x`)
// went out as `/openai/../admin`: a gateway that resolves dot segments (nginx, most) served `/admin`,
// outside the base path the operator gave. It is refused instead, never forwarded.
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;
let seen: string[];

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-climb-"));
  seen = [];
  upstream = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      seen.push(req.url ?? "");
      res.writeHead(200, { "content-type": "application/json" }).end("{}");
    });
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/openai/v1`), kind, controlToken: "t", finishWaitMs: 3000 });
  proxyUrl = await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

/** Sends `path` exactly as given (no client normalization of dot segments). */
function raw(method: string, path: string, body?: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(proxyUrl, { method, path, headers: body ? { "content-type": "application/json" } : {} }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (text += chunk));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

it("a route climbing above its root is refused, never forwarded outside the upstream's base path", async () => {
  const chat = JSON.stringify({ model: "m", messages: [] });
  for (const [method, path] of [
    ["GET", "/../admin"],
    ["GET", "/v1/../../admin"],
    ["GET", "/%2e%2e/admin"],
    ["GET", "/v1/..%2f..%2fadmin"],
    ["GET", "/ng-rollout/r1/../admin"],
    ["POST", "/ng-rollout/r1/v1/../../../v1/chat/completions"],
  ] as const) {
    const answer = await raw(method, path, method === "POST" ? chat : undefined);
    expect([path, answer.status, JSON.parse(answer.body).error?.code]).toEqual([path, 400, "invalid_request"]);
  }
  expect(seen).toEqual([]);
  // Dot segments that stay within the route still go through, as sent.
  expect((await raw("GET", "/v1/x/../models")).status).toBe(200);
  expect((await raw("POST", "/ng-rollout/r1/v1/x/../chat/completions", chat)).status).toBe(200);
  expect(seen).toEqual(["/openai/v1/x/../models", "/openai/v1/x/../chat/completions"]);
});
