import { spawnSync } from "node:child_process";
import { chmod, mkdir, mkdtemp, rm, stat } from "node:fs/promises";
import { createServer, request, type IncomingHttpHeaders, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";
import { PROXY_ENTRY, commonArgs, spawnServer, type SpawnedServer } from "../e2e/model-processes.js";

/**
 * `/v1/responses` and `/v1/messages` through the attach proxy process, streaming and not, against an
 * in-test upstream that records what it received and can stall a stream mid-way (to show the
 * proxy forwards events as they come instead of buffering the stream).
 */
const TOKEN = "routes-secret";
let nats: NatsFixture;
let root: string;
let upstream: Server;
let upstreamUrl: string;
let proxy: SpawnedServer;

interface Seen {
  method: string;
  url: string;
  headers: IncomingHttpHeaders;
  body: string;
}
let seen: Seen[] = [];
/** Model call ids whose upstream stream was closed before it finished. */
const cutOff: string[] = [];
/** Streams stall after their first event until this resolves. */
let release: () => void = () => undefined;
let stalled: Promise<void> = Promise.resolve();

const RESPONSES_EVENTS = [
  'event: response.created\ndata: {"type":"response.created","response":{"id":"resp_1","status":"in_progress"}}\n\n',
  'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"Hel"}\n\n',
  'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":"lo"}\n\n',
  'event: response.completed\ndata: {"type":"response.completed","response":{"id":"resp_1","status":"completed","usage":{"input_tokens":11,"output_tokens":2,"total_tokens":13}}}\n\n',
];
const MESSAGES_EVENTS = [
  'event: message_start\ndata: {"type":"message_start","message":{"id":"msg_1","role":"assistant","content":[],"usage":{"input_tokens":21,"output_tokens":1}}}\n\n',
  'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"Hi"}}\n\n',
  'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":4}}\n\n',
  'event: message_stop\ndata: {"type":"message_stop"}\n\n',
];

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-model-routes-"));
  upstream = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      seen.push({ method: req.method ?? "", url: req.url ?? "", headers: req.headers, body });
      const path = (req.url ?? "").split("?")[0];
      if (path === "/v1/models") return void res.writeHead(200, { "content-type": "application/json" }).end('{"object":"list","data":[]}');
      if (path === "/v1/echo" || path === "/v1/%65cho") return void res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ body }));
      const parsed = body ? (JSON.parse(body) as { stream?: boolean; fail?: boolean }) : {};
      if (parsed.fail) return void res.writeHead(400, { "content-type": "application/json" }).end('{"error":{"message":"bad request"}}');
      const staging = { "x-ng-staging-key": `stage/${req.headers["x-ng-model-call-id"]}` };
      if (path === "/v1/responses" && !parsed.stream) {
        return void res
          .writeHead(200, { "content-type": "application/json", ...staging })
          .end(JSON.stringify({ id: "resp_1", object: "response", output: [{ type: "message", content: [{ type: "output_text", text: "Hello" }] }], usage: { input_tokens: 11, output_tokens: 2, total_tokens: 13 } }));
      }
      if (path === "/v1/messages" && !parsed.stream) {
        return void res
          .writeHead(200, { "content-type": "application/json", ...staging })
          .end(JSON.stringify({ id: "msg_1", type: "message", role: "assistant", content: [{ type: "text", text: "Hi" }], usage: { input_tokens: 21, output_tokens: 4 } }));
      }
      const events = path === "/v1/responses" ? RESPONSES_EVENTS : MESSAGES_EVENTS;
      res.writeHead(200, { "content-type": "text/event-stream", "cache-control": "no-cache", ...staging });
      res.on("close", () => {
        if (!res.writableFinished) cutOff.push(String(req.headers["x-ng-model-call-id"]));
      });
      res.write(events[0]);
      void stalled.then(() => {
        for (const event of events.slice(1)) res.write(event);
        res.end();
      });
    });
  });
  await new Promise<void>((resolve) => upstream.listen(0, "127.0.0.1", resolve));
  upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
  proxy = await spawnServer(
    "proxy",
    PROXY_ENTRY,
    commonArgs(nats.server.url, "modelroutes", "policy_model", TOKEN, ["--upstream", `${upstreamUrl}/v1`, "--cuts", "off", "--ledger-dir", join(root, "ledger")]),
  );
});

afterAll(async () => {
  release();
  await proxy?.kill();
  upstream?.closeAllConnections();
  await new Promise<void>((resolve) => (upstream ? upstream.close(() => resolve()) : resolve()));
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});

beforeEach(() => {
  seen = [];
  stalled = new Promise<void>((resolve) => (release = resolve));
});

const ledger = async (key: string): Promise<any[]> =>
  ((await (await fetch(`${proxy.url}/ng-capture/v1/ledger/${key}`, { headers: { authorization: `Bearer ${TOKEN}` } })).json()) as any).records;

/** A POST with its path sent exactly as given (fetch would normalize dot segments). */
function rawPost(path: string, body: string): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(`${proxy.url}${path}`, { method: "POST", headers: { "content-type": "application/json" } }, (res) => {
      let text = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (text += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.path = path;
    req.on("error", reject);
    req.end(body);
  });
}

/** Reads a streamed body until `until` appears in it (the response keeps streaming). */
async function readUntil(reader: ReadableStreamDefaultReader<Uint8Array>, soFar: string, until: string): Promise<string> {
  const decoder = new TextDecoder();
  let text = soFar;
  while (!text.includes(until)) {
    const { done, value } = await reader.read();
    if (done) throw new Error(`stream ended before ${until}: ${text}`);
    text += decoder.decode(value, { stream: true });
  }
  return text;
}

describe.each([
  ["/v1/responses", { model: "m", input: "Say hello", instructions: "brief" }, RESPONSES_EVENTS, { prompt_tokens: 11, completion_tokens: 2, total_tokens: 13 }],
  ["/v1/messages", { model: "m", max_tokens: 16, system: "brief", messages: [{ role: "user", content: "Say hi" }] }, MESSAGES_EVENTS, { prompt_tokens: 21, completion_tokens: 4, total_tokens: 25 }],
])("%s through the attach proxy", (route, request, events, usage) => {
  const key = `routes${route.replace(/\W/g, "-")}`;

  it("passes a non-streamed call through byte for byte with lineage headers and records its row", async () => {
    // Unusual spacing and key order: the proxy forwards the bytes it received, not a re-serialization.
    const raw = `{ "stream": false,\n  ${JSON.stringify(request).slice(1)}`;
    const response = await fetch(`${proxy.url}/ng-rollout/${key}${route}?beta=true`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: "Bearer user-key", "anthropic-version": "2023-06-01", "accept-encoding": "gzip, br" },
      body: raw,
    });
    expect(response.status).toBe(200);
    const body = (await response.json()) as any;
    expect(body.usage).toMatchObject({ input_tokens: usage.prompt_tokens });
    expect(seen).toHaveLength(1);
    const call = seen[0]!;
    expect([call.method, call.url, call.body]).toEqual(["POST", `${route}?beta=true`, raw]);
    // Asked for uncompressed, whatever the caller accepts: its usage is read from the answer's last bytes.
    expect(call.headers).toMatchObject({
      "x-ng-capture-key": key,
      authorization: "Bearer user-key",
      "anthropic-version": "2023-06-01",
      "content-length": String(Buffer.byteLength(raw)),
      "accept-encoding": "identity",
    });
    expect(call.headers["x-ng-model-call-id"]).toMatch(/^mc-/);
    expect(call.headers["x-ng-parent-call-id"]).toBeUndefined();
    const rows = await ledger(key);
    expect(rows.map((r) => [r.model_call_id, r.parent_call_id, r.route, r.staging_key, r.usage])).toEqual([
      [call.headers["x-ng-model-call-id"], null, route, `stage/${call.headers["x-ng-model-call-id"]}`, usage],
    ]);
  });

  it("streams events as they come (never buffering the stream), then records the row with its parent", async () => {
    const response = await fetch(`${proxy.url}/ng-rollout/${key}${route}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...request, stream: true }),
    });
    expect(response.status).toBe(200);
    expect(response.headers.get("content-type")).toBe("text/event-stream");
    const reader = response.body!.getReader();
    // The first event arrives while the upstream still holds the rest of the stream.
    const first = await readUntil(reader, "", events[0]!);
    expect(first).toBe(events[0]);
    expect(await ledger(key)).toHaveLength(1); // no row before the response completed
    release();
    const all = await readUntil(reader, first, events.at(-1)!);
    expect(all).toBe(events.join(""));
    expect((await reader.read()).done).toBe(true);
    const call = seen[0]!;
    expect(call.headers["x-ng-parent-call-id"]).toMatch(/^mc-/);
    const rows = await ledger(key);
    expect(rows).toHaveLength(2);
    expect(rows[1]).toMatchObject({ model_call_id: call.headers["x-ng-model-call-id"], parent_call_id: rows[0].model_call_id, route, usage });
  });

  it("a caller that leaves mid-stream drops the upstream call and records no row", async () => {
    const leaving = new AbortController();
    const response = await fetch(`${proxy.url}/ng-rollout/${key}-left${route}`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ ...request, stream: true }),
      signal: leaving.signal,
    });
    await readUntil(response.body!.getReader(), "", events[0]!);
    leaving.abort();
    const callId = String(seen[0]!.headers["x-ng-model-call-id"]);
    await waitUntil(() => cutOff.includes(callId), "the upstream stream to be closed by the proxy");
    release();
    expect(await ledger(`${key}-left`)).toEqual([]);
  });

  it("passes an upstream refusal through and records no row", async () => {
    const response = await fetch(`${proxy.url}/ng-rollout/${key}-refused${route}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify({ ...request, fail: true }) });
    expect(response.status).toBe(400);
    expect(await response.json()).toEqual({ error: { message: "bad request" } });
    expect(await ledger(`${key}-refused`)).toEqual([]);
  });
});

describe("the proxy process", () => {
  it("listens on 127.0.0.1 by default", () => {
    expect(new URL(proxy.url).hostname).toBe("127.0.0.1");
  });

  it("refuses a default ledger directory another user could have planted (a level writable by others)", async () => {
    const shared = join(root, "shared-tmp");
    const top = `gym-ckpt-ledger-${process.getuid!()}`;
    await mkdir(join(shared, top), { recursive: true });
    await chmod(join(shared, top), 0o777);
    const run = spawnSync(process.execPath, [PROXY_ENTRY, ...commonArgs(nats.server.url, "modelroutes", "planted", TOKEN, ["--upstream", `${upstreamUrl}/v1`])], {
      env: { ...process.env, TMPDIR: shared },
      encoding: "utf8",
      timeout: 20_000,
    });
    expect(run.status).toBe(2);
    expect(run.stderr).toContain(`${join(shared, top)} is writable by group or others`);
    // A private default is created 0700 at every level.
    await chmod(join(shared, top), 0o700);
    const ok = await spawnServer("proxy-private", PROXY_ENTRY, commonArgs(nats.server.url, "modelroutes", "private", TOKEN, ["--upstream", `${upstreamUrl}/v1`]), 20_000, { ...process.env, TMPDIR: shared });
    try {
      expect((await stat(join(shared, top, "modelroutes", "private"))).mode & 0o777).toBe(0o700);
    } finally {
      await ok.kill();
    }
  });
});

describe("other routes", () => {
  it("pass through untracked, with or without the rollout prefix", async () => {
    const bare = await fetch(`${proxy.url}/v1/models`);
    expect(await bare.json()).toEqual({ object: "list", data: [] });
    const prefixed = await fetch(`${proxy.url}/ng-rollout/other/v1/models`, { headers: { "accept-encoding": "gzip" } });
    expect(prefixed.status).toBe(200);
    expect(seen.map((s) => [s.method, s.url, s.headers["x-ng-capture-key"]])).toEqual([
      ["GET", "/v1/models", undefined],
      ["GET", "/v1/models", undefined],
    ]);
    expect(seen[1]!.headers["accept-encoding"]).toBe("gzip"); // untracked: the caller's headers as they came
    expect(await ledger("other")).toEqual([]);
  });

  it("refuse a near miss of the ledger API (not_found) instead of forwarding it and its control token upstream", async () => {
    for (const path of ["/ng-capture/v1", "//ng-capture/v1/status", "/NG-CAPTURE/v1/status", "/ng-capture/v2/status", "/ng-capture%2Fv1/status", "/ng-rollout/r1/ng-capture/v1/status"]) {
      const response = await rawPost(path, "{}");
      expect({ path, status: response.status, code: (JSON.parse(response.body) as { error: { code: string } }).error.code }).toEqual({ path, status: 404, code: "not_found" });
    }
    expect(seen).toEqual([]);
  });

  it("pass a request body of unknown length (chunked) through intact", async () => {
    const parts = ['{"purpose":', '"batch"}'];
    const body = new ReadableStream<Uint8Array>({
      start(controller) {
        for (const part of parts) controller.enqueue(new TextEncoder().encode(part));
        controller.close();
      },
    });
    const response = await fetch(`${proxy.url}/v1/echo`, { method: "PUT", body, duplex: "half" } as RequestInit);
    expect(response.status).toBe(200);
    // Chunked on the upstream hop, or with a length when the whole body had already arrived.
    expect(((await response.json()) as { body: string }).body).toBe(parts.join(""));
    expect(seen.map((s) => s.method)).toEqual(["PUT"]);
  });

  it("track a generation route in any spelling (encoded, trailing or doubled slashes, dot segments, case): forwarded as sent, one ledger row each", async () => {
    release(); // the upstream streams its whole answer at once
    const tracked = [
      "/ng-rollout/sp/v1/chat/completions/",
      "/ng-rollout/sp/v1/chat/%63ompletions",
      "/ng-rollout/sp/v1//chat/completions",
      "/ng-rollout/sp/v1/chat/./completions",
      "/ng-rollout/sp/v1/x/../chat/completions",
      "/ng-rollout/sp/V1/Chat/Completions",
      "/ng-rollout/sp/v1/chat%2Fcompletions",
    ];
    const request = JSON.stringify({ model: "m", messages: [{ role: "user", content: "hi" }], stream: true });
    for (const spelling of tracked) expect([spelling, (await rawPost(spelling, request)).status]).toEqual([spelling, 200]);
    expect(seen.map((s) => s.url)).toEqual(tracked.map((t) => t.slice("/ng-rollout/sp".length)));
    const rows = await ledger("sp");
    expect(rows.map((r) => r.route)).toEqual(tracked.map(() => "/v1/chat/completions"));
    // Each is the next call of the rollout: one lineage, no untracked generation.
    expect(rows.map((r) => r.parent_call_id)).toEqual([null, ...rows.slice(0, -1).map((r) => r.model_call_id)]);
    // Without a recognisable prefix, or with malformed encoding, they are refused.
    for (const [spelling, code] of [
      ["//ng-rollout/sp/v1/chat/completions", "rollout_id_required"],
      ["/v1/responses/", "rollout_id_required"],
      ["/ng-rollout/sp/v1/chat/%E0%A4%A", "invalid_request"],
    ] as const) {
      const { status, body } = await rawPost(spelling, request);
      expect([spelling, status, JSON.parse(body).error.code]).toEqual([spelling, 400, code]);
    }
    expect(seen).toHaveLength(tracked.length);
    // Other routes still pass through as they are, encoded or not.
    expect((await rawPost("/ng-rollout/sp/v1/%65cho", "{}")).status).toBe(200);
    expect(seen.at(-1)!.url).toBe("/v1/%65cho");
  });

  it("refuse generation calls without the prefix, with a non-JSON body or one nested too deep", async () => {
    const bare = await fetch(`${proxy.url}/v1/responses`, { method: "POST", headers: { "content-type": "application/json" }, body: "{}" });
    expect([bare.status, ((await bare.json()) as any).error.code]).toEqual([400, "rollout_id_required"]);
    const garbled = await fetch(`${proxy.url}/ng-rollout/g/v1/messages`, { method: "POST", headers: { "content-type": "application/json" }, body: "{not json" });
    expect([garbled.status, ((await garbled.json()) as any).error.code]).toEqual([400, "invalid_request"]);
    // Nested past MAX_JSON_DEPTH: refused before it is forwarded (its cut record could never be made).
    let deep: unknown = "x";
    for (let i = 0; i < 200; i++) deep = [deep];
    const nested = await fetch(`${proxy.url}/ng-rollout/deep/v1/responses`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ model: "m", input: [{ role: "user", content: "hi", blob: deep }] }),
    });
    expect([nested.status, ((await nested.json()) as any).error.code]).toEqual([400, "invalid_request"]);
    expect(await ledger("deep")).toEqual([]);
    // A capture key with malformed percent-encoding on the ledger API is bad input, not an internal error.
    const malformed = await fetch(`${proxy.url}/ng-capture/v1/ledger/%E0%A4%A`, { headers: { authorization: `Bearer ${TOKEN}` } });
    expect([malformed.status, ((await malformed.json()) as any).error.code]).toEqual([400, "invalid_request"]);
    expect(seen).toEqual([]);
  });
});
