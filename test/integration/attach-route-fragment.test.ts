import { mkdtemp } from "node:fs/promises";
import { createServer, request, type IncomingHttpHeaders, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";

// A request target with a fragment (`#...`, which origin-form does not allow but Node's parser
// accepts) is read by uvicorn's httptools parser, vLLM's server, as the path before the `#`: a
// generation call spelled so must be tracked like any other spelling, not pass through untracked.
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;
let seen: { url: string; headers: IncomingHttpHeaders }[] = [];

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-review-fragment-"));
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
  proxy = createAttachProxy({ upstream: parseUpstream(upstreamUrl), kind, controlToken: "t" });
  proxyUrl = await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

/** A POST with its request target sent exactly as given. */
function rawPost(path: string): Promise<number> {
  return new Promise((resolve, reject) => {
    const req = request(`${proxyUrl}/`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
      res.resume();
      res.on("end", () => resolve(res.statusCode ?? 0));
    });
    req.path = path;
    req.on("error", reject);
    req.end(JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] }));
  });
}

it("tracks a generation call whose request target carries a fragment", async () => {
  for (const target of ["/ng-rollout/frag/v1/chat/completions#x", "/ng-rollout/frag/v1/chat/completions#x?y=1", "/ng-rollout/frag/v1/chat/completions?y=1#x"]) {
    expect([target, await rawPost(target)]).toEqual([target, 200]);
  }
  // Each was forwarded as a tracked call (with its lineage headers) and has its row.
  expect(seen.map((s) => typeof s.headers["x-ng-model-call-id"])).toEqual(["string", "string", "string"]);
  const rows = await kind.ledger.rows("frag");
  expect(rows.map((r) => r.route)).toEqual(["/v1/chat/completions", "/v1/chat/completions", "/v1/chat/completions"]);
  // Without the prefix it is refused, as any unprefixed generation call is.
  expect(await rawPost("/v1/chat/completions#x")).toBe(400);
});
