import { mkdtemp } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";

// A request Node's HTTP parser refuses before the proxy sees it (a bad header, headers past the
// parser's limit) is still a refusal of a participant's data-plane route: catalog body, not Node's bare 400/431.
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: URL;
let kind: ModelKind;
let upstreamCalls = 0;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-review-malformed-"));
  upstreamCalls = 0;
  upstream = createServer((req, res) => {
    upstreamCalls += 1;
    req.resume();
    res.end("{}");
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(upstreamUrl), kind, controlToken: "t" });
  proxyUrl = new URL(await listenLocal(proxy));
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

/** Sends `raw` on a new connection and reads until the proxy closes it. */
function rawExchange(raw: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const socket = connect(Number(proxyUrl.port), proxyUrl.hostname, () => socket.write(raw));
    let text = "";
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => (text += chunk));
    socket.on("close", () => resolve(text));
    socket.on("error", reject);
  });
}

it.each([
  ["a malformed content-length", "POST /ng-rollout/bad/v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: abc\r\n\r\n"],
  ["headers past the parser's limit", `POST /ng-rollout/bad/v1/chat/completions HTTP/1.1\r\nHost: a\r\nX-Big: ${"x".repeat(64 * 1024)}\r\n\r\n`],
  // Node answers those itself (a bare 417) unless told otherwise.
  ["an Expect other than 100-continue", "POST /ng-rollout/bad/v1/chat/completions HTTP/1.1\r\nHost: a\r\nExpect: foo\r\nContent-Length: 2\r\n\r\n{}"],
])("answers %s with a catalog refusal", async (_name, raw) => {
  const reply = await rawExchange(raw);
  const [head, body] = reply.split("\r\n\r\n");
  expect(head!.split("\r\n")[0]).toBe("HTTP/1.1 400 Bad Request");
  expect(JSON.parse(body!)).toMatchObject({ error: { code: "invalid_request" } });
  expect(upstreamCalls).toBe(0);
  expect(kind.tickets.size).toBe(0);
});

it("serves a request without Host (Node's bare 400 otherwise): the upstream gets its own", async () => {
  const reply = await rawExchange("GET /health HTTP/1.1\r\nConnection: close\r\n\r\n");
  expect(reply.split("\r\n")[0]).toBe("HTTP/1.1 200 OK");
});
