import { mkdtemp } from "node:fs/promises";
import { createServer, request, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { waitUntil } from "../support/wait-until.js";
import { closeAttachFixture, ledgerWriteFailingWhen, listenLocal } from "../support/attach-proxy-fixture.js";

// A stream's final event waits for the ledger row (docs/attach.md): the caller must never hold it whole
// unless the row is written. A Responses API `response.completed` carries the whole output, so for a
// long answer it is longer than the 64 KiB the proxy holds of one event before it lets the older part
// go. Its name is in that older part: the rest of it, blank line included, must still wait.
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;
let failWrites = false;

const text = "x".repeat(200 * 1024);
const EVENTS = [
  'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1","status":"in_progress"}}\n\n',
  'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"xx"}\n\n',
  `event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_1","status":"completed","output":[{"type":"message","content":[{"type":"output_text","text":"${text}"}]}],"usage":{"input_tokens":11,"output_tokens":2,"total_tokens":13}}}\n\n`,
];
const FINAL = EVENTS.at(-1)!;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-long-final-"));
  failWrites = false;
  upstream = createServer((req, res) => {
    req.resume();
    req.on("end", async () => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      const stream = EVENTS.join("");
      // Network-sized pieces, each its own chunk at the proxy.
      for (let at = 0; at < stream.length; at += 8192) {
        res.write(stream.slice(at, at + 8192));
        await new Promise((resolve) => setImmediate(resolve));
      }
      res.end();
    });
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null, ledgerWrite: ledgerWriteFailingWhen(() => failWrites) });
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/v1`), kind, controlToken: "t", finishWaitMs: 3000 });
  proxyUrl = await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

function streamResponses(key: string): Promise<string> {
  return new Promise((resolve, reject) => {
    let received = "";
    const req = request(`${proxyUrl}/ng-rollout/${key}/v1/responses`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => (received += chunk));
      res.on("end", () => resolve(received));
      res.on("error", () => resolve(received));
      res.on("close", () => resolve(received));
    });
    req.on("error", reject);
    req.end(JSON.stringify({ model: "m", stream: true, input: "hi" }));
  });
}

it("a final event longer than what the proxy holds of one event still reaches the caller whole only after its row", async () => {
  const delivered = await streamResponses("long-1");
  expect(delivered).toBe(EVENTS.join(""));
  await waitUntil(() => kind.tickets.size === 0, "the ticket to close");
  expect((await kind.ledger.rows("long-1")).length).toBe(1);
});

it("a final event longer than what the proxy holds of one event never reaches the caller whole when its row cannot be written", async () => {
  failWrites = true;
  const delivered = await streamResponses("long-2");
  await waitUntil(() => kind.tickets.size === 0, "the ticket to close");
  expect(await kind.ledger.rows("long-2")).toEqual([]);
  expect(delivered.length, "the caller got part of the final event").toBeGreaterThan(EVENTS[0]!.length + EVENTS[1]!.length);
  expect(delivered.endsWith(FINAL), "the caller holds the whole response.completed though its row was never written").toBe(false);
});
