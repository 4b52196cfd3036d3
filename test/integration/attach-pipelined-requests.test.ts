import { mkdtemp } from "node:fs/promises";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import { connect, type AddressInfo, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { setTimeout as delay } from "node:timers/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { waitUntil } from "../support/wait-until.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";

/**
 * An HTTP/1.1 caller pipelining generation calls on one keep-alive connection: every call is
 * answered, in order, and recorded, also when the first answer is slow, streamed, or a later one is
 * larger than the socket buffers (its response waits behind the first, unattached to the socket).
 */
let dir: string;
let upstream: Server;
let proxy: Server;
let kind: ModelKind;
/** The upstream's answer to each call, by the content of its user message. */
let answer: (content: string, res: ServerResponse) => void;
const sockets: Socket[] = [];

const completion = (content: string) => JSON.stringify({ choices: [{ message: { role: "assistant", content } }], usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } });

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-pipelined-"));
  answer = (content, res) => res.end(completion(`re:${content}`));
  upstream = createServer((req: IncomingMessage, res: ServerResponse) => {
    let body = "";
    req.setEncoding("utf8");
    req.on("data", (chunk: string) => (body += chunk));
    req.on("end", () => {
      res.writeHead(200, { "content-type": "application/json" });
      answer((JSON.parse(body) as { messages: { content: string }[] }).messages[0]!.content, res);
    });
  });
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(`${await listenLocal(upstream)}/v1`), kind, controlToken: "t" });
  await listenLocal(proxy);
});

afterEach(async () => {
  for (const socket of sockets.splice(0)) socket.destroy();
  // A ticket a failing case left open would hold kind.close() (it waits for recorded calls) for good.
  for (const ticket of [...kind.tickets.values()]) kind.fail(ticket);
  await closeAttachFixture({ proxy, upstream, kind, dir });
});

/** Writes the calls back to back in one write on a fresh connection; returns what comes back. */
function pipeline(calls: { key: string; content: string; stream?: boolean }[]): { received: () => string; socket: Socket } {
  const socket = connect((proxy.address() as AddressInfo).port, "127.0.0.1");
  sockets.push(socket);
  let received = "";
  socket.setEncoding("latin1");
  socket.on("data", (chunk: string) => (received += chunk));
  socket.on("error", () => undefined);
  const requests = calls.map(({ key, content, stream }) => {
    const body = JSON.stringify({ model: "m", ...(stream && { stream: true }), messages: [{ role: "user", content }] });
    return `POST /ng-rollout/${key}/v1/chat/completions HTTP/1.1\r\nHost: p\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`;
  });
  socket.write(requests.join(""));
  return { received: () => received, socket };
}

const statusLines = (text: string) => text.match(/HTTP\/1\.1 \d{3}/g) ?? [];

describe("attach proxy: pipelined generation calls on one connection", () => {
  it("answers both of two calls written back to back, in order, and records both", async () => {
    const { received } = pipeline([
      { key: "p-1", content: "one" },
      { key: "p-2", content: "two" },
    ]);
    await waitUntil(() => received().includes("re:two"), "the second answer");
    expect(statusLines(received())).toEqual(["HTTP/1.1 200", "HTTP/1.1 200"]);
    expect(received().indexOf("re:one")).toBeLessThan(received().indexOf("re:two"));
    await waitUntil(() => kind.tickets.size === 0, "both tickets to close");
    expect((await kind.ledger.rows("p-1")).length).toBe(1);
    expect((await kind.ledger.rows("p-2")).length).toBe(1);
  });

  it("answers a second call larger than the socket buffers behind a slow first", async () => {
    const big = "x".repeat(4 * 1024 * 1024);
    let slow: ServerResponse | undefined;
    answer = (content, res) => {
      if (content === "slow") slow = res;
      else res.end(completion(big));
    };
    const { received } = pipeline([
      { key: "s-1", content: "slow" },
      { key: "s-2", content: "big" },
    ]);
    await waitUntil(() => slow !== undefined, "the first call to reach the upstream");
    slow!.end(completion("slow-done"));
    await waitUntil(() => received().endsWith("\r\n0\r\n\r\n") && received().length > big.length, "the big answer", 20_000);
    expect(statusLines(received())).toEqual(["HTTP/1.1 200", "HTTP/1.1 200"]);
    await waitUntil(() => kind.tickets.size === 0, "both tickets to close");
    expect((await kind.ledger.rows("s-2")).length).toBe(1);
  }, 30_000);

  // The first call streams on for longer than the proxy's finish wait (200 ms here): the queued answer,
  // recorded and ended (small) or paused for the full connection (1 MiB), cannot leave meanwhile.
  for (const [size, length] of [
    ["small", 16],
    ["large", 1024 * 1024],
  ] as const) {
    it(`does not cut a ${size} answer queued behind a first call slower than the finish wait`, async () => {
      proxy.closeAllConnections();
      await new Promise((r) => proxy.close(r));
      const upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/v1`;
      proxy = createAttachProxy({ upstream: parseUpstream(upstreamUrl), kind, controlToken: "t", finishWaitMs: 200 });
      await listenLocal(proxy);
      const text = "x".repeat(length);
      let slow: ServerResponse | undefined;
      let queuedSent = false;
      answer = (content, res) => {
        if (content === "slow") return void (slow = res);
        res.end(completion(text), () => (queuedSent = true));
      };
      const { received } = pipeline([
        { key: "w-1", content: "slow", stream: true },
        { key: "w-2", content: "queued" },
      ]);
      await waitUntil(() => slow !== undefined && queuedSent, "the queued answer to leave the upstream");
      slow!.write(`data: ${JSON.stringify({ choices: [{ delta: { content: "a" } }] })}\n\n`);
      await delay(600); // the first call's duration, past the finish wait: what the case is about
      slow!.end("data: [DONE]\n\n");
      // Both chunked: the second answer has come whole once the stream ends in a last chunk after it.
      await waitUntil(() => received().length > length && statusLines(received()).length === 2 && received().endsWith("}\r\n0\r\n\r\n"), "the queued answer", 20_000);
      expect(statusLines(received())).toEqual(["HTTP/1.1 200", "HTTP/1.1 200"]);
      await waitUntil(() => kind.tickets.size === 0, "both tickets to close");
      expect((await kind.ledger.rows("w-1")).length).toBe(1);
      expect((await kind.ledger.rows("w-2")).length).toBe(1);
    }, 30_000);
  }

  it("answers a call pipelined behind a streamed one, on the same key: its parent is the streamed call", async () => {
    answer = (content, res) => {
      if (content !== "stream") return res.end(completion("after"));
      res.write(`data: ${JSON.stringify({ choices: [{ delta: { content: "a" } }] })}\n\n`);
      res.end("data: [DONE]\n\n");
    };
    const { received } = pipeline([
      { key: "k-1", content: "stream", stream: true },
      { key: "k-1", content: "next" },
    ]);
    await waitUntil(() => received().includes('"after"'), "the second answer");
    expect(statusLines(received())).toEqual(["HTTP/1.1 200", "HTTP/1.1 200"]);
    await waitUntil(() => kind.tickets.size === 0, "both tickets to close");
    expect((await kind.ledger.rows("k-1")).length).toBe(2);
  });

  // Node closes only the response attached to a dying connection: one queued behind it heard neither
  // 'close' nor 'finish', so its ticket (row written) stayed open for good and a retire of its attempt
  // waited for it until its deadline.
  it("closes the ticket of an answer queued behind a slow first when the caller's connection dies", async () => {
    let slow: ServerResponse | undefined;
    answer = (content, res) => {
      if (content === "slow") slow = res;
      else res.end(completion("queued"));
    };
    const { socket } = pipeline([
      { key: "d-1", content: "slow" },
      { key: "d-2", content: "queued" },
    ]);
    await waitUntil(async () => slow !== undefined && (await kind.ledger.rows("d-2")).length === 1, "the queued answer's row");
    socket.destroy();
    await waitUntil(() => kind.tickets.size === 0, "both tickets to close", 3_000);
    // The caller never got the queued answer: its row is taken back.
    expect(await kind.ledger.rows("d-2")).toEqual([]);
    slow!.end(completion("late"));
  });

  it("lets a retire of a queued call's attempt finish once the caller's connection died", async () => {
    answer = (content, res) => {
      if (content !== "slow") res.end(completion("queued"));
    };
    const { socket } = pipeline([
      { key: "r-1", content: "slow" },
      { key: "r-2", content: "queued" },
    ]);
    await waitUntil(async () => (await kind.ledger.rows("r-2")).length === 1, "the queued answer's row");
    socket.destroy();
    let timer: NodeJS.Timeout | undefined;
    const retired = await Promise.race([
      kind.retire([{ rollout_id: "r-2", attempt: 0 }]).then(() => true),
      new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), 3_000))),
    ]);
    clearTimeout(timer);
    expect(retired).toBe(true);
  });
});
