import { mkdtemp, rm } from "node:fs/promises";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { HttpControllerApi } from "../../../coordinator/api/http-api.js";
import { waitUntil } from "../../support/wait-until.js";
import { makeEngine, writers } from "./fake-participants.js";

/**
 * A refusal written on the raw socket (a body that stopped coming, a request Node's parser refused)
 * is read by an HTTP/1.1 client as the answer to the oldest request on that connection not yet
 * answered. Pipelined behind an op still running, it answered that op `invalid_request` ("nothing
 * ran") while the op ran: everyone parked by a prepare told it was refused. Behind such an op the
 * connection is closed instead, unanswered (to its client an unknown outcome, which it is).
 */
const WAIT_MS = 300;
let root: string;
let http: HttpControllerApi | undefined;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-pipelined-refusal-"));
});
afterEach(async () => {
  await http?.stop();
  http = undefined;
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/** Writes `text` on a new connection; resolves with all the server wrote once it closes the connection. */
function exchange(base: string, text: string): Promise<string> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => socket.write(text));
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error("the server kept the connection open for 5 s"));
    }, 5_000);
    let received = "";
    socket.on("data", (chunk: Buffer) => (received += chunk.toString()));
    socket.on("error", () => undefined);
    socket.on("close", () => {
      clearTimeout(timer);
      resolve(received);
    });
  });
}

const prepareRequest = (body: string, length = Buffer.byteLength(body)) =>
  `POST /v1/prepare HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer t\r\nContent-Length: ${length}\r\n\r\n${body}`;

describe("HTTP API: a refusal of a request pipelined behind an op still running", () => {
  it.each([
    ["whose body stops coming", prepareRequest('{"checkpoint_id":', 1000)],
    ["that Node's parser refuses", "POST /v1/prepare HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n"],
  ])("(%s) is never read as that op's answer", async (_what, second) => {
    const { engine, leadership } = makeEngine(root);
    let release!: () => void;
    let ran = false;
    const prepare = engine.prepare.bind(engine);
    engine.prepare = async (request) => {
      await new Promise<void>((resolve) => (release = resolve));
      ran = true;
      return prepare(request);
    };
    http = new HttpControllerApi({ engine, leadership, token: "t", bodyWaitMs: WAIT_MS });
    const base = await http.start();
    const received = exchange(base, prepareRequest(JSON.stringify({ checkpoint_id: "p1" })) + second);
    await waitUntil(() => release !== undefined, "the first prepare to run");
    // The second request's refusal comes while the first op still runs (the body wait, or at once
    // for the parser's): the connection closes then (exchange gives up after 5 s), the op still held.
    let answer: string;
    try {
      answer = await received;
      expect(ran).toBe(false);
    } finally {
      release();
    }
    await waitUntil(() => ran, "the first prepare to finish");
    expect(answer).not.toMatch(/^HTTP\/1\.1 400/);
  });
});
