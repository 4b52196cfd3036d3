import { mkdtemp } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createAttachProxy } from "../../participants/attach/attach-proxy.js";
import { parseUpstream } from "../../participants/attach/upstream-url.js";
import { ModelKind } from "../../participants/kinds/model/index.js";
import { closeAttachFixture, listenLocal, postStreamedChat } from "../support/attach-proxy-fixture.js";

// Every call a checkpoint catches is refused admission_closed and retried by its caller: an
// expected refusal, logged at debug, not a warning with a stack per call (a chaos run logged 8,412).
let dir: string;
let upstream: Server;
let proxy: Server;
let proxyUrl: string;
let kind: ModelKind;
let lines: { level: number; msg: string; code?: string }[];

beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-attach-closed-log-"));
  upstream = createServer((req, res) => {
    req.resume();
    req.on("end", () => res.writeHead(200, { "content-type": "application/json" }).end('{"choices":[]}'));
  });
  kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
  lines = [];
  const logger = pino({ level: "debug" }, new Writable({ write: (chunk: Buffer, _enc, done) => (lines.push(JSON.parse(chunk.toString())), done()) }));
  proxy = createAttachProxy({ upstream: parseUpstream(`${await listenLocal(upstream)}/v1`), kind, controlToken: "t", logger });
  proxyUrl = await listenLocal(proxy);
});

afterEach(() => closeAttachFixture({ proxy, upstream, kind, dir }));

describe("a generation call refused while admission is closed", () => {
  it("is answered admission_closed and logged at debug, with no warning", async () => {
    await kind.closeAdmission();
    const reply = await postStreamedChat(proxyUrl, "r1");
    expect(JSON.parse(reply.body)).toMatchObject({ error: { code: "admission_closed" } });
    expect(lines.filter((l) => l.msg === "attach proxy call refused: admission closed")).toEqual([expect.objectContaining({ level: 20, code: "admission_closed" })]);
    expect(lines.filter((l) => l.level >= 40)).toEqual([]);
    await kind.openAdmission();
    expect((await postStreamedChat(proxyUrl, "r1")).status).toBe(200);
  });
});
