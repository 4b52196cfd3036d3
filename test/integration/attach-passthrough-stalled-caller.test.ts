import { mkdtemp } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { connect, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal } from "../support/attach-proxy-fixture.js";
import { waitUntil } from "../support/wait-until.js";

// An untracked call's answer (`/v1/models`, `/v1/embeddings`, a download) is paused while the
// caller's socket is full. It had no stall bound: a caller that stopped reading held the upstream
// connection until shutdown. It now has the generation calls' one (finishWaitMs without a drain: cut).
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: URL;
let kind: ModelKind;
let upstreamClosed = false;

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-passthrough-stall-"));
  upstreamClosed = false;
  // An answer without end, written as fast as the proxy takes it.
  upstream = createServer((_req, res) => {
    res.on("close", () => (upstreamClosed = true));
    res.writeHead(200, { "content-type": "application/octet-stream" });
    const piece = Buffer.alloc(64 * 1024, 120);
    const pump = (): void => {
      while (!res.destroyed && res.write(piece));
      if (!res.destroyed) res.once("drain", pump);
    };
    pump();
  });
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  proxy = createAttachProxy({ upstream: parseUpstream(`${await listenLocal(upstream)}/v1`), kind, controlToken: "t", finishWaitMs: 1000 });
  proxyUrl = new URL(await listenLocal(proxy));
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

it("cuts a passthrough caller that stops reading once its full socket has not drained for finishWaitMs, dropping the upstream call", async () => {
  // Its own end of the connection: the caller, not reading, would not see the close.
  let cut = false;
  proxy.once("connection", (accepted: Socket) => accepted.on("close", () => (cut = true)));
  const socket = connect(Number(proxyUrl.port), proxyUrl.hostname);
  socket.on("error", () => undefined);
  await new Promise((resolve) => socket.once("connect", resolve));
  socket.write("GET /v1/files/big/content HTTP/1.1\r\nHost: a\r\n\r\n");
  // Reads the head and a first piece, then stops reading: the proxy's writes fill the socket.
  await new Promise((resolve) => socket.once("data", resolve));
  socket.pause();
  try {
    await waitUntil(() => upstreamClosed, "the upstream call to be dropped", 10_000);
    await waitUntil(() => cut, "the caller's connection to be cut", 10_000);
  } finally {
    socket.destroy();
  }
});

it("does not cut a caller that keeps reading, however long the answer takes", async () => {
  const socket = connect(Number(proxyUrl.port), proxyUrl.hostname);
  let received = 0;
  let closed = false;
  socket.on("error", () => undefined);
  socket.on("close", () => (closed = true));
  await new Promise((resolve) => socket.once("connect", resolve));
  socket.write("GET /v1/files/big/content HTTP/1.1\r\nHost: a\r\n\r\n");
  // Reads in bursts, each pause shorter than finishWaitMs, for several times finishWaitMs.
  socket.on("data", (chunk: Buffer) => (received += chunk.length));
  try {
    for (let i = 0; i < 8; i++) {
      socket.pause();
      await new Promise((resolve) => setTimeout(resolve, 100));
      socket.resume();
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect({ closed, upstreamClosed }).toEqual({ closed: false, upstreamClosed: false });
    expect(received).toBeGreaterThan(1024 * 1024);
  } finally {
    socket.destroy();
  }
});
