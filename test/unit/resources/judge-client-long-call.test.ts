import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { JudgeClient } from "../../../participants/verifiers/index.js";
import { passFakeTime as pass } from "../../support/fake-time.js";
import { startHeldCallee, type HeldCallee } from "../../support/held-callee.js";

/**
 * A judge may be configured to take longer than 300 s (`requestTimeoutMs`): a large judge model
 * behind a busy queue. Node's fetch gives up after 300 s without response headers (undici's
 * headersTimeout), which would cut every such configuration to 300 s without a word.
 */

let server: HeldCallee | undefined;

// One fake clock for the whole file: fetch's timers (module state in Node's undici, created at its
// first call) run on it, so 300 s pass without waiting for them.
beforeAll(() => void vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "setInterval", "clearInterval", "Date", "performance"] }));
afterAll(async () => {
  vi.useRealTimers();
  await server?.close();
});

describe("JudgeClient", () => {
  it("a judge answering after more than 300 s, within its requestTimeoutMs, gets its answer read", async () => {
    server = await startHeldCallee();
    const judge = new JudgeClient({ baseUrl: server.url, requestTimeoutMs: 3_600_000 });
    let outcome: unknown = "pending";
    const call = judge.ask([{ role: "user", content: "same?" }]).then(
      (text) => (outcome = text),
      (error: unknown) => (outcome = error),
    );
    const res = await server.arrived();
    await pass(310_000);
    const completion = { id: "x", object: "chat.completion", choices: [{ index: 0, message: { role: "assistant", content: "YES" }, finish_reason: "stop" }] };
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(completion));
    await call;
    expect(outcome).toBe("YES");
  });
});
