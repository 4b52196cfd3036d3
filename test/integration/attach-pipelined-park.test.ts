import { mkdtemp } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { connect, type AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTimeout as delay } from "node:timers/promises";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { waitUntil } from "../support/wait-until.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";

/**
 * A caller pipelines requests on one keep-alive connection behind a call whose response the proxy
 * holds for a checkpoint. Node answers pipelined requests in order, so a later one's response
 * (16 KiB or more) is buffered behind the held one and Node stops reading the socket; a request
 * whose body was not all read by then stays incomplete for as long as the checkpoint lasts. Node's
 * `server.requestTimeout` (300 s by default, checked every 30 s) then cut the whole connection,
 * the held call with it (answered with a 400 naming ERR_HTTP_REQUEST_TIMEOUT). Here the proxy's own
 * limits are scaled down to test time (300 s become 0.5 s, Node's 30 s check interval 50 ms).
 */
const SCALE = 600;
/** 20 minutes at the proxy's scale. */
const PARK_MS = 2000;

let dir: string;
let upstream: Server;
let proxy: Server;
let kind: ModelKind;
let generation: ServerResponse | undefined;
const responses = new Map<string, ServerResponse>();

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-pipe-"));
  generation = undefined;
  responses.clear();
  upstream = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on("end", () => {
      if (req.url?.endsWith("/chat/completions")) generation = res;
      else res.end(JSON.stringify({ data: "m".repeat(64 * 1024) }));
    });
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/v1`), kind, controlToken: "t" });
  // Every limit Node checks, scaled alike (its check swaps the two when headers' exceeds the request's).
  (proxy as Server & { connectionsCheckingInterval: number }).connectionsCheckingInterval = 30_000 / SCALE; // read at listen
  proxy.requestTimeout = Math.ceil(proxy.requestTimeout / SCALE);
  proxy.headersTimeout = Math.ceil(proxy.headersTimeout / SCALE);
  proxy.on("request", (req: IncomingMessage, res: ServerResponse) => responses.set(req.url ?? "", res));
  await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

describe("attach proxy: pipelined requests behind a held response", () => {
  it("a call held longer than Node's request limit is not cut with its connection", async () => {
    const socket = connect((proxy.address() as AddressInfo).port, "127.0.0.1");
    let received = "";
    let closed = false;
    socket.setEncoding("utf8");
    socket.on("data", (chunk: string) => (received += chunk));
    socket.on("error", () => undefined);
    socket.on("close", () => (closed = true));
    const chat = JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }] });
    socket.write(`POST /ng-rollout/pipe-1/v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\nContent-Length: ${chat.length}\r\n\r\n${chat}`);
    await waitUntil(() => generation !== undefined, "the upstream to receive the call");
    await kind.closeAdmission();
    generation!.writeHead(200, { "content-type": "application/json" });
    generation!.end(JSON.stringify({ choices: [{ message: { role: "assistant", content: "hello" } }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }));
    await waitUntil(() => kind.readiness().counts.held === 1, "the response to be held");

    // A passthrough whose 64 KiB answer is buffered behind the held one ...
    socket.write("GET /v1/models HTTP/1.1\r\nHost: p\r\n\r\n");
    await waitUntil(() => (responses.get("/v1/models")?.writableLength ?? 0) >= 16 * 1024, "the models answer to be buffered");
    // ... so Node stops reading after the next request's headers: half its body stays unread.
    socket.write("POST /v1/embeddings HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"a\":");
    await waitUntil(() => responses.has("/v1/embeddings"), "its headers to be read");
    socket.write("\"bcd\"}");

    await delay(PARK_MS); // the checkpoint lasts longer than the request limit
    expect(received).toBe("");
    expect(closed).toBe(false);
    await kind.openAdmission();
    await waitUntil(() => received.includes("hello") && received.split("HTTP/1.1 ").length - 1 >= 2, "the held answer and the models answer");
    expect(received.startsWith("HTTP/1.1 200")).toBe(true);
    expect(closed).toBe(false);
    socket.destroy();
  }, 20_000);
});
