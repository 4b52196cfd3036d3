import { mkdtemp, rm } from "node:fs/promises";
import { connect } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { HttpControllerApi } from "../../../coordinator/api/http-api.js";
import { ErrorReplySchema } from "../../../protocol/index.js";
import { makeEngine, writers } from "./fake-participants.js";

/**
 * The HTTP API's wait for a request body (Fastify sets no request timeout): a body that stops
 * coming is cut with the catalog refusal; an op running longer than the wait is not.
 */
const WAIT_MS = 300;
let root: string;
let http: HttpControllerApi | undefined;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-body-wait-"));
});
afterEach(async () => {
  await http?.stop();
  http = undefined;
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/** Writes `text` on a new connection and returns all the server wrote, with when it closed (ms after the write); fails after 5 s without a close. */
function exchange(base: string, text: string): Promise<{ received: string; closedAfterMs: number }> {
  const { hostname, port } = new URL(base);
  return new Promise((resolve, reject) => {
    let sentAt = 0;
    const socket = connect(Number(port), hostname, () => {
      socket.write(text);
      sentAt = performance.now();
    });
    const timer = setTimeout(() => {
      socket.destroy();
      reject(new Error("the server kept the connection open for 5 s"));
    }, 5_000);
    let received = "";
    socket.on("data", (chunk: Buffer) => (received += chunk.toString()));
    socket.on("error", reject);
    socket.on("close", () => {
      clearTimeout(timer);
      resolve({ received, closedAfterMs: performance.now() - sentAt });
    });
  });
}

describe("HTTP API: the wait for a request body", () => {
  it("cuts an authenticated request whose body stops coming, with invalid_request, and runs nothing", async () => {
    const { engine, leadership, fake } = makeEngine(root);
    http = new HttpControllerApi({ engine, leadership, token: "t", bodyWaitMs: WAIT_MS });
    const base = await http.start();
    const head = "POST /v1/prepare HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nAuthorization: Bearer t\r\nContent-Length: 1000\r\n\r\n";
    const { received, closedAfterMs } = await exchange(base, `${head}{"checkpoint_id":`);
    expect(received.split("\r\n")[0]).toBe("HTTP/1.1 400 Bad Request");
    expect(ErrorReplySchema.parse(JSON.parse(received.slice(received.indexOf("\r\n\r\n") + 4))).error.code).toBe("invalid_request");
    expect(closedAfterMs).toBeGreaterThanOrEqual(WAIT_MS - 50);
    expect(fake.calls).toEqual([]);
  });

  it("does not cut an op that runs longer than the wait once its body is in (nor one without a body)", async () => {
    const { engine, leadership } = makeEngine(root);
    // Ops that take three waits (the engine's clock is a test clock: the delay is real time here).
    const slowly = <A extends unknown[], R>(op: (...args: A) => Promise<R>) => async (...args: A) => {
      await new Promise((resolve) => setTimeout(resolve, 3 * WAIT_MS));
      return op(...args);
    };
    engine.prepare = slowly(engine.prepare.bind(engine));
    engine.status = slowly(engine.status.bind(engine));
    http = new HttpControllerApi({ engine, leadership, token: "t", bodyWaitMs: WAIT_MS });
    const base = await http.start();
    const headers = { authorization: "Bearer t", "content-type": "application/json" };
    const slow = await fetch(`${base}/v1/prepare`, { method: "POST", headers, body: JSON.stringify({ checkpoint_id: "slow-1" }) });
    expect(slow.status).toBe(200);
    expect(await slow.json()).toMatchObject({ checkpoint_id: "slow-1", prepared: true });
    // No body at all.
    const bodiless = await fetch(`${base}/v1/status`, { headers: { authorization: "Bearer t" } });
    expect(bodiless.status).toBe(200);
  });
});
