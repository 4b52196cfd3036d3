import { mkdtemp } from "node:fs/promises";
import { createServer, request, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { waitUntil } from "../support/wait-until.js";
import { closeAttachFixture, ledgerWriteFailingWhen, listenLocal } from "../support/attach-proxy-fixture.js";

// A streamed answer's caller holds the complete answer as soon as `data: [DONE]` arrives.
// openai-python (the Gym's client) breaks out of its SSE loop at [DONE] and closes the response
// (`finally: response.close()` in openai/_streaming.py), which drops the connection when the chunked
// terminator has not been read yet; vLLM/uvicorn send [DONE] and the terminator in separate writes.
// The proxy therefore holds back an event that may end the stream until the ledger row is written, so:
//  - a caller that stops at [DONE] still has its call recorded;
//  - a row write that fails leaves the caller without [DONE] (a cut, incomplete answer).
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;
let failWrites = false;
let terminatorDelayMs = 0;
/** When set, the upstream writes its first event and waits for this before the rest. */
let gate: Promise<void> | null = null;

const SSE = [
  'data: {"choices":[{"delta":{"content":"He"}}]}\n\n',
  'data: {"choices":[{"delta":{"content":"llo"}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n',
  "data: [DONE]\n\n",
];

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-review-done-"));
  failWrites = false;
  terminatorDelayMs = 0;
  gate = null;
  upstream = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      res.writeHead(200, { "content-type": "text/event-stream" });
      // terminatorDelayMs < 0: [DONE] and the terminating chunk in one write (the best case for the proxy).
      if (terminatorDelayMs < 0) {
        for (const event of SSE.slice(0, -1)) res.write(event);
        return void res.end(SSE.at(-1));
      }
      if (gate) {
        res.write(SSE[0]);
        res.write(SSE[1]);
        return void gate.then(() => res.end(SSE[2]));
      }
      for (const event of SSE) res.write(event);
      // A server finishing its stream (engine bookkeeping, an ASGI server's last send) a moment after [DONE].
      setTimeout(() => res.end(), terminatorDelayMs);
    });
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({
    ledgerDir: join(dir, "ledger"),
    cutBackend: null,
    ledgerWrite: ledgerWriteFailingWhen(() => failWrites),
  });
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/v1`), kind, controlToken: "t", finishWaitMs: 3000 });
  proxyUrl = await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

/** As openai-python's Stream: read events until `data: [DONE]`, then close the response (the connection). */
function callLikeOpenAIPython(key: string): Promise<{ text: string; sawDone: boolean }> {
  return new Promise((resolve, reject) => {
    const req = request(`${proxyUrl}/ng-rollout/${key}/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (chunk: string) => {
        text += chunk;
        if (text.includes("data: [DONE]\n\n")) {
          res.destroy(); // break + response.close()
          resolve({ text, sawDone: true });
        }
      });
      res.on("end", () => resolve({ text, sawDone: text.includes("data: [DONE]") }));
      res.on("error", () => resolve({ text, sawDone: text.includes("data: [DONE]") }));
    });
    req.on("error", reject);
    req.end(JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] }));
  });
}

describe("attach proxy, a streamed answer read by a caller that stops at [DONE] (openai-python)", () => {
  it("records the call the caller received in full", async () => {
    terminatorDelayMs = 200;
    const { text, sawDone } = await callLikeOpenAIPython("done-1");
    expect(sawDone).toBe(true);
    expect(text).toBe(SSE.join("")); // the caller holds the whole answer and goes on to its next call
    await waitUntil(() => kind.tickets.size === 0, "the ticket to close");
    // Its next call must have this one as parent: the row must be there.
    expect((await kind.ledger.rows("done-1")).length, "the delivered call's row").toBe(1);
  });

  it("never hands the caller a complete answer when the row cannot be written", async () => {
    failWrites = true;
    const { sawDone } = await callLikeOpenAIPython("done-3");
    await waitUntil(() => kind.tickets.size === 0, "the ticket to close");
    expect(await kind.ledger.rows("done-3")).toEqual([]);
    // docs/attach.md: "the caller never holds a complete answer the ledger does not know"
    expect(sawDone, "the caller got [DONE] although the row was never written").toBe(false);
  });
});

describe("attach proxy, a stream's events before [DONE]", () => {
  it("reach the caller while the upstream is still streaming", async () => {
    let open = () => undefined as void;
    gate = new Promise((resolve) => (open = resolve));
    let text = "";
    const ended = new Promise<void>((resolve, reject) => {
      const req = request(`${proxyUrl}/ng-rollout/early-1/v1/chat/completions`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
        res.setEncoding("utf8");
        res.on("data", (chunk: string) => (text += chunk));
        res.on("end", resolve);
      });
      req.on("error", reject);
      req.end(JSON.stringify({ model: "m", stream: true, messages: [{ role: "user", content: "hi" }] }));
    });
    // Events that cannot end the stream leave as they come, the last one included.
    await waitUntil(() => text === SSE[0]! + SSE[1]!, "the events so far to reach the caller");
    expect(await kind.ledger.rows("early-1")).toEqual([]);
    open();
    await ended;
    expect(text).toBe(SSE.join(""));
    await waitUntil(() => kind.tickets.size === 0, "the ticket to close");
    expect((await kind.ledger.rows("early-1")).length).toBe(1);
  });
});

describe("attach proxy, openai-python-style callers with a prompt upstream (no delays anywhere)", () => {
  it.each([
    ["[DONE] and the terminator in separate writes", 0],
    ["[DONE] and the terminator in one write", -1],
  ])("records every call whose caller received [DONE] (%s)", async (_name, delay) => {
    terminatorDelayMs = delay;
    let done = 0;
    for (let i = 0; i < 50; i++) if ((await callLikeOpenAIPython("done-4")).sawDone) done += 1;
    await waitUntil(() => kind.tickets.size === 0, "the tickets to close");
    expect(done).toBe(50);
    expect((await kind.ledger.rows("done-4")).length, "rows of the 50 delivered calls").toBe(50);
  });
});
