import { mkdtemp } from "node:fs/promises";
import { createServer, type Server, type ServerResponse } from "node:http";
import { connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { AttachProxyShutdown } from "../../participants/attach/proxy-shutdown.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";
import { waitUntil } from "../support/wait-until.js";

// Shutdown begins while a kept-alive connection's streamed answer is under way: the answer finishes,
// and then the connection closes, so it cannot carry another call to the upstream during the drain.
let dir: string;
let upstream: Server;
let proxy: Server;
let kind: ModelKind;
let streaming: ServerResponse | undefined;
let client: Socket | undefined;
const upstreamSaw: string[] = [];

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-stop-ka-"));
  streaming = undefined;
  upstreamSaw.length = 0;
  upstream = createServer((req, res) => {
    upstreamSaw.push(req.url ?? "");
    req.resume();
    req.on("end", () => {
      if (!req.url?.includes("chat")) return void res.end('{"data":[]}');
      res.writeHead(200, { "content-type": "text/event-stream" });
      res.write('data: {"choices":[{"delta":{"content":"a"}}]}\n\n');
      streaming = res;
    });
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/v1`), kind, controlToken: "t" });
  // Node's idle keep-alive timeout (5 s) would close the connection anyway, later: not what is tested.
  proxy.keepAliveTimeout = 120_000;
});

afterEach(async () => {
  client?.destroy();
  await closeAttachFixture({ proxy, upstream, kind, dir });
});

describe("attach proxy stop: a connection whose answer was under way", () => {
  it("closes after that answer instead of staying open for more calls during the drain", async () => {
    const shutdown = new AttachProxyShutdown(proxy, kind, undefined, 60_000);
    const url = new URL(await listenLocal(proxy));
    const body = JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] });
    let received = "";
    let closed = false;
    client = connect(Number(url.port), url.hostname);
    client.on("data", (chunk: Buffer) => (received += chunk.toString("utf8")));
    client.on("close", () => (closed = true));
    client.on("error", () => undefined);
    client.write(`POST /ng-rollout/ka-1/v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
    await waitUntil(() => streaming !== undefined && received.includes("choices"), "the stream to start");
    shutdown.stopAdmitting();
    streaming!.end("data: [DONE]\n\n");
    await waitUntil(() => received.includes("0\r\n\r\n"), "the stream to end");
    await waitUntil(() => closed, "the connection to close after its answer", 2_000);
    expect(upstreamSaw).toEqual(["/v1/chat/completions"]);
    expect(await kind.ledger.rows("ka-1")).toHaveLength(1);
    await shutdown.close();
  });
});
