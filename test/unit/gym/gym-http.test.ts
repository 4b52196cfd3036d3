import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { postJson } from "../../../participants/gym/agent-server/gym-http.js";
import { passFakeTime as pass } from "../../support/fake-time.js";
import { startHeldCallee, type HeldCallee } from "../../support/held-callee.js";

/**
 * The reference servers' data-plane calls wait for as long as their callee works: an agent's
 * activate spans its whole turn loop, and any call may be parked through a checkpoint (a held
 * policy response, a resources request waiting for resume). Node's fetch gives up after 300 s
 * (undici's headersTimeout and bodyTimeout), which would fail such an episode with internal_error.
 */

let server: HeldCallee | undefined;

async function callee(): Promise<HeldCallee> {
  server = await startHeldCallee();
  return server;
}

// One fake clock for the whole file: fetch's timers (module state in Node's undici, created at its
// first call) run on it, so each test lets 300 s pass without waiting for them.
beforeAll(() => void vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "setInterval", "clearInterval", "Date", "performance"] }));
afterAll(() => void vi.useRealTimers());

afterEach(async () => {
  await server?.close();
  server = undefined;
});

describe("reference Gym data-plane calls", () => {
  it("a call answered after more than 300 s (an activation running long or parked through a checkpoint) gets its answer", async () => {
    const { url, arrived } = await callee();
    let outcome: unknown = "pending";
    const call = postJson(`${url}/ng-rollout/r1/activate`, { task: {} }).then(
      (reply) => (outcome = reply.body),
      (error: unknown) => (outcome = error),
    );
    const response = await arrived();
    await pass(310_000);
    response.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ answer: "42" }));
    await call;
    expect(outcome).toEqual({ answer: "42" });
  });

  it("a streamed answer that pauses more than 300 s between chunks (a policy response held through a checkpoint) arrives whole", async () => {
    const { url, arrived } = await callee();
    let outcome: unknown = "pending";
    const call = postJson(`${url}/ng-rollout/r1/v1/chat/completions`, { stream: true }).then(
      (reply) => (outcome = reply.body),
      (error: unknown) => (outcome = error),
    );
    const response = await arrived();
    response.writeHead(200, { "content-type": "text/event-stream" });
    response.write("data: one\n\n");
    await pass(310_000);
    response.end("data: [DONE]\n\n");
    await call;
    expect(outcome).toBe("data: one\n\ndata: [DONE]\n\n");
  });
});
