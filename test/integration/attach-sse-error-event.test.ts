import { mkdtemp } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { waitUntil } from "../support/wait-until.js";
import { closeAttachFixture, listenLocal, postStreamedChat } from "../support/attach-proxy-fixture.js";

// A 200 stream can still fail: vLLM on an engine error sends `data: {"error":{...}}` then [DONE]; the
// Responses API ends in `response.failed` or `event: error`; the Messages API sends `event: error`.
// openai/anthropic clients raise on it and the caller re-issues the call, so it must not be recorded
// as delivered (the re-issued call would get it as its parent, and a commit would export it).
const STREAMS: Record<string, string[]> = {
  "vllm-chat": [
    'data: {"choices":[{"delta":{"content":"He"}}]}\n\n',
    'data: {"error":{"message":"engine dead: CUDA error","type":"InternalServerError","code":500}}\n\n',
    "data: [DONE]\n\n",
  ],
  // SSE lines may end in a bare CR.
  "cr-chat": ['data: {"choices":[{"delta":{"content":"He"}}]}\r\r', 'data: {"error":{"message":"engine dead","code":500}}\r\r', "data: [DONE]\r\r"],
  "responses-failed": [
    'event: response.created\ndata: {"type":"response.created","response":{"id":"r1","status":"in_progress"}}\n\n',
    'event: response.failed\ndata: {"type":"response.failed","response":{"id":"r1","status":"failed","error":{"code":"server_error","message":"x"}}}\n\n',
  ],
  // The failed response carries its output so far: an event longer than the proxy's 16 KiB tail (and than one socket read).
  "responses-longfailed": [
    'event: response.created\ndata: {"type":"response.created","response":{"id":"r1","status":"in_progress"}}\n\n',
    `event: response.failed\ndata: {"type":"response.failed","response":{"id":"r1","status":"failed","error":{"code":"server_error","message":"x"},"output":[{"type":"message","content":[{"type":"output_text","text":"${"lorem ".repeat(40_000)}"}]}]}}\n\n`,
  ],
  "responses-error": [
    'event: response.created\ndata: {"type":"response.created","response":{"id":"r1","status":"in_progress"}}\n\n',
    'event: error\ndata: {"type":"error","code":"server_error","message":"x"}\n\n',
  ],
  "messages-error": [
    'event: message_start\ndata: {"type":"message_start","message":{"id":"m1","usage":{"input_tokens":3,"output_tokens":1}}}\n\n',
    'event: error\ndata: {"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}\n\n',
  ],
};

let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;


beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-sse-error-"));
  upstream = createServer((req, res) => {
    req.resume();
    req.on("end", () => {
      const events = STREAMS[String(req.headers["x-ng-capture-key"]).split("-").slice(0, 2).join("-")] ?? STREAMS["vllm-chat"]!;
      res.writeHead(200, { "content-type": "text/event-stream" });
      for (const event of events.slice(0, -1)) res.write(event);
      res.end(events.at(-1));
    });
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/v1`), kind, controlToken: "t", finishWaitMs: 3000 });
  proxyUrl = await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

describe("attach proxy, a 200 stream that ends in an error event", () => {
  it.each(Object.keys(STREAMS))("passes it through whole and records no row (%s)", async (style) => {
    const key = `${style}-1`;
    const answer = await postStreamedChat(proxyUrl, key);
    expect(answer).toEqual({ status: 200, body: STREAMS[style]!.join("") });
    await waitUntil(() => kind.tickets.size === 0, "the ticket to close");
    expect(await kind.ledger.rows(key)).toEqual([]);
  });
});
