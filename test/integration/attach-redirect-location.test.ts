import { mkdtemp } from "node:fs/promises";
import { createServer, request, type IncomingHttpHeaders, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";

// vLLM's and SGLang's servers are FastAPI apps: Starlette's router answers a route spelled with a
// trailing slash (`POST /v1/chat/completions/`) with `307` to the slashless route, as an absolute URL
// built from the Host header, which the proxy sets to the upstream's. openai-python follows redirects
// (307 keeps the method and body): unrewritten, the caller re-sent its generation call straight to the
// upstream, past the proxy, untracked and whatever the checkpoint's admission said.
let dir: string;
let upstream: Server;
let upstreamUrl: string;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;
let seen: { url: string; captureKey: string | undefined }[];

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-redirect-"));
  seen = [];
  upstream = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const url = req.url ?? "/";
      const captureKey = req.headers["x-ng-capture-key"];
      seen.push({ url, captureKey: typeof captureKey === "string" ? captureKey : undefined });
      const [path, query] = url.split("?");
      // Starlette's redirect_slashes: `URL(scope=…)`, scheme and Host from the request.
      if (path!.length > 1 && path!.endsWith("/")) {
        return void res.writeHead(307, { location: `http://${req.headers.host}${path!.slice(0, -1)}${query ? `?${query}` : ""}` }).end();
      }
      if (path === "/v1/elsewhere") return void res.writeHead(302, { location: "https://example.invalid/v1/models" }).end();
      if (path === "/v1/relative") return void res.writeHead(302, { location: "models" }).end();
      if (path === "/v1/models") return void res.writeHead(200, { "content-type": "application/json" }).end('{"object":"list","data":[]}');
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ id: "c1", choices: [], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }));
    });
  });
  upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/v1`), kind, controlToken: "t", finishWaitMs: 3000 });
  proxyUrl = await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

function call(method: string, url: string, body?: string): Promise<{ status: number; headers: IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method, headers: body ? { "content-type": "application/json" } : {} }, (res) => {
      res.resume();
      res.on("end", () => resolve({ status: res.statusCode ?? 0, headers: res.headers }));
    });
    req.on("error", reject);
    req.end(body);
  });
}

it("a generation call redirected by the upstream to its own origin is sent back through the proxy, under its rollout prefix", async () => {
  const body = JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] });
  const first = await call("POST", `${proxyUrl}/ng-rollout/r1/v1/chat/completions/?x=1`, body);
  expect(first.status).toBe(307);
  expect(first.headers.location).toBe("/ng-rollout/r1/v1/chat/completions?x=1");
  // Followed as an HTTP client does (resolved against the URL it called): the proxy again, and tracked.
  const followed = await call("POST", new URL(first.headers.location!, proxyUrl).href, body);
  expect(followed.status).toBe(200);
  expect(seen.map((s) => s.captureKey)).toEqual(["r1", "r1"]);
  expect((await kind.captureManifest("r1")).records).toHaveLength(1);
});

it("a passthrough route's redirect to the upstream's origin stays on the proxy; others are left as sent", async () => {
  expect((await call("GET", `${proxyUrl}/v1/models/`)).headers.location).toBe("/v1/models");
  expect((await call("GET", `${proxyUrl}/ng-rollout/r1/v1/models/`)).headers.location).toBe("/ng-rollout/r1/v1/models");
  expect((await call("GET", `${proxyUrl}/v1/elsewhere`)).headers.location).toBe("https://example.invalid/v1/models");
  expect((await call("GET", `${proxyUrl}/v1/relative`)).headers.location).toBe("models");
});
