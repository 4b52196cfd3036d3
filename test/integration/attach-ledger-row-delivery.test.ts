import { mkdtemp, readFile } from "node:fs/promises";
import { createServer, type Server, type ServerResponse } from "node:http";
import type { Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { gzipSync } from "node:zlib";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { waitUntil } from "../support/wait-until.js";
import { cutRecord } from "../unit/model/model-fixtures.js";
import { closeAttachFixture, ledgerWriteFailingWhen, listenLocal } from "../support/attach-proxy-fixture.js";

// The attach proxy in-process between a real client and a real upstream, with the ledger's file
// write as a seam: how a call's lineage row and the caller's response relate.
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;
let failWrites = false;
/** Calls the upstream received. */
let upstreamCalls = 0;
/** The proxy's response to the last call; with `hold`, its bytes stay in Node's socket buffer until `release`. */
let proxied: ServerResponse | undefined;
let hold = false;
let release: () => void = () => undefined;

/** Keeps what is written to a socket in Node's buffer (the write never reaches the kernel) until released. */
function holdWrites(socket: Socket): () => void {
  const held: (() => void)[] = [];
  const target = socket as unknown as { _write: (...args: unknown[]) => void; _writev?: (...args: unknown[]) => void };
  const { _write: write, _writev: writev } = target;
  target._write = (...args) => void held.push(() => write.apply(socket, args));
  if (writev) target._writev = (...args) => void held.push(() => writev.apply(socket, args));
  return () => {
    target._write = write;
    if (writev) target._writev = writev;
    for (const run of held.splice(0)) run();
  };
}

/** A long streamed answer (4 MiB of events, more than any socket buffer), written with backpressure as inference servers do. */
function streamLong(res: ServerResponse): void {
  res.writeHead(200, { "content-type": "text/event-stream" });
  const event = `data: {"choices":[{"delta":{"content":"${"x".repeat(64 * 1024)}"}}]}\n\n`;
  let sent = 0;
  const pump = () => {
    while (sent < 64 && !res.destroyed) {
      sent += 1;
      if (!res.write(event)) return void res.once("drain", pump);
    }
    if (!res.destroyed) res.end(SSE.at(-1));
  };
  pump();
}

const SSE = ['data: {"choices":[{"delta":{"content":"He"}}]}\n\n', 'data: {"choices":[{"delta":{"content":"llo"}}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n', "data: [DONE]\n\n"];
const JSON_BODY = JSON.stringify({ choices: [{ message: { role: "assistant", content: "Hello" } }], usage: { prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 } });

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-row-"));
  failWrites = false;
  upstreamCalls = 0;
  proxied = undefined;
  hold = false;
  upstream = createServer((req, res) => {
    upstreamCalls += 1;
    const chunks: Buffer[] = [];
    req.on("data", (c: Buffer) => chunks.push(c));
    req.on("end", () => {
      const body = JSON.parse(Buffer.concat(chunks).toString("utf8")) as { stream?: boolean; messages: { content: string }[] };
      if (body.messages[0]?.content === "compressible" && /\bgzip\b/.test(String(req.headers["accept-encoding"]))) {
        const gzipped = gzipSync(JSON_BODY); // as a gzip middleware (or nginx) in front of the server would
        return void res.writeHead(200, { "content-type": "application/json", "content-encoding": "gzip", "content-length": gzipped.length }).end(gzipped);
      }
      if (body.messages[0]?.content === "overloaded") return void res.writeHead(503, { "content-type": "application/json" }).end('{"error":{"message":"overloaded"}}');
      if (!body.stream) return void res.writeHead(200, { "content-type": "application/json", "content-length": Buffer.byteLength(JSON_BODY) }).end(JSON_BODY);
      if (body.messages[0]?.content === "engine-error") {
        // vLLM on an engine error: a 200 stream whose last event before [DONE] is an error.
        res.writeHead(200, { "content-type": "text/event-stream" });
        res.write(SSE[0]);
        return void res.end('data: {"error":{"message":"engine dead","code":500}}\n\ndata: [DONE]\n\n');
      }
      if (body.messages[0]?.content === "long") return streamLong(res);
      res.writeHead(200, { "content-type": "text/event-stream" });
      for (const event of SSE) res.write(event);
      res.end();
    });
  });
  const upstreamUrl = await listenLocal(upstream);
  kind = new ModelKind({
    ledgerDir: join(dir, "ledger"),
    cutBackend: null,
    ledgerWrite: ledgerWriteFailingWhen(() => failWrites),
    ledgerProbeIntervalMs: 0, // every refused call tries the storage again
  });
  proxy = createAttachProxy({ upstream: parseUpstream(`${upstreamUrl}/v1`), kind, controlToken: "t", finishWaitMs: 3000 });
  proxy.prependListener("request", (_req, res: ServerResponse) => {
    proxied = res;
    if (hold) release = holdWrites(res.socket!);
  });
  proxyUrl = await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

const call = (key: string, stream: boolean, content = "hi") =>
  fetch(`${proxyUrl}/ng-rollout/${key}/v1/chat/completions`, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ model: "m", stream, messages: [{ role: "user", content }] }),
  });

describe.each([
  ["a content-length answer", false, JSON_BODY],
  ["a streamed (chunked) answer", true, SSE.join("")],
])("attach proxy, %s", (_name, stream, expected) => {
  it("is delivered whole once its row is written", async () => {
    const response = await call("row-ok", stream);
    expect(await response.text()).toBe(expected);
    expect((await kind.ledger.rows("row-ok")).map((r) => r.usage)).toEqual([{ prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 }]);
  });

  it("is cut off before its last bytes when its row cannot be written: the caller never holds a complete answer the ledger lacks", async () => {
    failWrites = true;
    // Whether the head got out first or not, the caller's call fails.
    await expect(call("row-fail", stream).then((response) => response.text())).rejects.toThrow();
    expect(kind.tickets.size).toBe(0);
    expect(await kind.ledger.rows("row-fail")).toEqual([]);
    // The disk has room again: the caller's retry succeeds and is the first call of the key.
    failWrites = false;
    expect(await (await call("row-fail", stream)).text()).toBe(expected);
    expect((await kind.ledger.rows("row-fail")).map((r) => r.parent_call_id)).toEqual([null]);
  });

  it("refuses later calls with storage_error before they reach the upstream while the ledger still cannot be written", async () => {
    failWrites = true;
    await expect(call("row-full", stream).then((response) => response.text())).rejects.toThrow();
    expect(upstreamCalls).toBe(1);
    const refused = await call("row-full", stream);
    expect(refused.status).toBe(507);
    expect(((await refused.json()) as { error: { code: string; detail: string } }).error).toMatchObject({ code: "storage_error", detail: expect.stringContaining("ENOSPC") });
    // Another rollout too: the storage is the ledger's, not the key's.
    expect((await call("row-other", stream)).status).toBe(507);
    expect(upstreamCalls).toBe(1);
    expect(kind.tickets.size).toBe(0);
    expect(kind.statusExtras().ledger_unwritable).toMatch(/ENOSPC/);
    failWrites = false;
    expect(await (await call("row-full", stream)).text()).toBe(expected);
    expect(upstreamCalls).toBe(2);
    expect(kind.statusExtras().ledger_unwritable).toBeNull();
  });
});

describe("attach proxy, an upstream that compresses when the caller accepts it", () => {
  it("is asked for an uncompressed answer, so the row records its usage", async () => {
    const response = await call("gz", false, "compressible"); // fetch sends accept-encoding: gzip, deflate, br
    expect(response.headers.get("content-encoding")).toBeNull();
    expect(await response.text()).toBe(JSON_BODY);
    expect((await kind.ledger.rows("gz")).map((r) => r.usage)).toEqual([{ prompt_tokens: 3, completion_tokens: 2, total_tokens: 5 }]);
  });
});

describe("attach proxy, a restored cut", () => {
  it("is given back when the upstream refuses the call that consumed it (non-2xx)", async () => {
    const request = { model: "m", stream: false, messages: [{ role: "user", content: "overloaded" }] };
    await kind.install([{ episode_id: { rollout_id: "rc", attempt: 0 }, rows: [], generation_cuts: [cutRecord("rc", request)] }], {});
    expect(kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    const response = await call("rc-a1", false, "overloaded");
    expect(response.status).toBe(503);
    await response.text();
    expect(kind.tickets.size).toBe(0);
    expect(kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
  });
});

describe("attach proxy, a restored cut consumed by a 200 stream that ends in an error event", () => {
  it("is given back and the call records no row", async () => {
    const request = { model: "m", stream: true, messages: [{ role: "user", content: "engine-error" }] };
    await kind.install([{ episode_id: { rollout_id: "rce", attempt: 0 }, rows: [], generation_cuts: [cutRecord("rce", request)] }], {});
    expect(kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
    const response = await call("rce-a1", true, "engine-error");
    expect(response.status).toBe(200);
    expect(await response.text()).toContain('"error"');
    await waitUntil(() => kind.tickets.size === 0, "the ticket to close");
    expect(await kind.ledger.rows("rce-a1")).toEqual([]);
    expect(kind.statusExtras()).toMatchObject({ restored_generation_cuts: 1 });
  });
});

describe("attach proxy, a recorded call whose response has not left yet", () => {
  it("keeps its ticket open (a readiness blocker) until the response has left for the caller", async () => {
    hold = true;
    const answer = call("flush", false);
    // Both, not just the row: under load (the suite beside helpers) a check right after the row
    // was written saw the response not ended yet.
    await waitUntil(async () => (await kind.ledger.rows("flush")).length === 1 && proxied?.writableEnded === true, "the row to be written and the response ended");
    // The row is in, the response ended, but its bytes are still in the proxy's socket buffer.
    expect(proxied!.writableFinished).toBe(false);
    expect(kind.tickets.size).toBe(1);
    expect(kind.readiness().blockers).toEqual(["flush"]);
    release();
    expect(await (await answer).text()).toBe(JSON_BODY);
    await waitUntil(() => kind.tickets.size === 0, "the ticket to close");
    expect(kind.readiness().blockers).toEqual([]);
    expect(await kind.ledger.rows("flush")).toHaveLength(1);
  });

  it("counts a caller that stops reading as gone once the finish wait is over: connection cut, row taken back, ticket closed", async () => {
    hold = true; // the response's bytes never leave Node's buffer, as with a caller that stopped reading
    const answer = call("stalled", true).then(
      (response) => response.text(),
      (error: unknown) => error,
    );
    await waitUntil(async () => (await kind.ledger.rows("stalled")).length === 1, "the row to be written");
    expect(kind.readiness().blockers).toEqual(["stalled"]);
    await waitUntil(() => kind.tickets.size === 0, "the finish wait (3 s) to end the ticket", 10_000);
    expect(proxied!.destroyed).toBe(true);
    expect(await answer).toBeInstanceOf(Error);
    expect(await kind.ledger.rows("stalled")).toEqual([]);
    expect(kind.readiness().blockers).toEqual([]);
  });

  it("counts a caller that stops reading mid-stream as gone once the finish wait passes without a drain: connection cut, upstream dropped, no row", async () => {
    hold = true; // nothing the proxy writes leaves Node's buffer: its socket is full, the upstream paused
    const answer = call("stalled-mid", true, "long").then(
      (response) => response.text(),
      (error: unknown) => error,
    );
    await waitUntil(() => kind.readiness().blockers.includes("stalled-mid"), "the response to start streaming");
    expect(await kind.ledger.rows("stalled-mid")).toEqual([]); // the answer never completed
    await waitUntil(() => kind.tickets.size === 0, "the finish wait (3 s) to end the ticket", 10_000);
    expect(proxied!.destroyed).toBe(true);
    expect(await answer).toBeInstanceOf(Error);
    expect(await kind.ledger.rows("stalled-mid")).toEqual([]);
    expect(kind.readiness().blockers).toEqual([]);
  });

  it("takes its row back when the caller leaves before the response has left: the re-issued call has no phantom parent", async () => {
    hold = true;
    const answer = call("gone", true).then(
      (response) => response.text(),
      (error: unknown) => error,
    );
    await waitUntil(async () => (await kind.ledger.rows("gone")).length === 1, "the row to be written");
    expect(kind.readiness().blockers).toEqual(["gone"]);
    proxied!.socket!.destroy(); // the caller's connection drops with the end still unsent
    expect(await answer).toBeInstanceOf(Error);
    await waitUntil(() => kind.tickets.size === 0, "the ticket to close");
    expect(await kind.ledger.rows("gone")).toEqual([]);
    hold = false;
    expect(await (await call("gone", true)).text()).toBe(SSE.join(""));
    expect((await kind.ledger.rows("gone")).map((r) => r.parent_call_id)).toEqual([null]);
  });
});

describe("attach proxy shutdown while a call's row waits for its stripe", () => {
  it("takes back the row of a call whose caller never got the answer (the attach binary's shutdown order)", async () => {
    const file = join(dir, "ledger", "sd.lineage.jsonl");
    expect(await (await call("sd", false)).text()).toBe(JSON_BODY);
    const before = await readFile(file, "utf8");
    // The key's stripe is busy (a slow read or rewrite of another key of the same stripe).
    let releaseStripe!: () => void;
    const busy = kind.ledger.locks.run("sd", () => new Promise<void>((resolve) => (releaseStripe = resolve)));
    const answer = call("sd", false).then(
      (response) => response.text(),
      (error: unknown) => error,
    );
    await waitUntil(() => [...kind.tickets.values()].some((t) => t.responseStarted), "the upstream answer");
    await new Promise((resolve) => setImmediate(resolve)); // the row's append is queued on the stripe

    // SIGTERM: participants/attach/main.ts closes every connection, the server, then the kind.
    proxy.closeAllConnections();
    await new Promise((resolve) => proxy.close(resolve));
    const kindClosed = kind.close();
    releaseStripe();
    await busy;
    await kindClosed;

    expect(await answer).toBeInstanceOf(Error);
    expect(kind.tickets.size).toBe(0);
    expect(await readFile(file, "utf8"), "the undelivered call's row stayed").toBe(before);
  });
});
