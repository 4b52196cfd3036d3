import { afterEach, describe, expect, it, vi } from "vitest";
import { runTurnLoop, seededState, type LoopDriver, type LoopState } from "../../../participants/gym/agent-server/tool-calling-agent.js";
import { refusalCode } from "../../support/refusal.js";

/**
 * A 200 stream can still fail: vLLM on an engine error sends `data: {"error":{...}}`, then [DONE].
 * The attach proxy passes it through and records no ledger row (the call is not delivered), as
 * OpenAI clients raise on it. The reference agent assembled the chunks around it instead and took
 * the partial text for the policy's final answer: the episode verified "He" (reward 0) and its final
 * boundary held an answer from a call the model participant never counted as delivered.
 */
afterEach(() => vi.unstubAllGlobals());

const sse = (...chunks: unknown[]) => [...chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`), "data: [DONE]\n\n"].join("");
const failed = sse({ choices: [{ delta: { role: "assistant", content: "He" } }] }, { error: { message: "engine dead: CUDA error", type: "InternalServerError", code: 500 } });
const answered = sse({ choices: [{ delta: { role: "assistant", content: "2" } }] }, { choices: [{ delta: {}, finish_reason: "stop" }] });

/** The policy answers each call with the next stream of `streams` (the last one again once they run out). */
function streamedPolicy(streams: string[]): { calls: () => number } {
  let calls = 0;
  vi.stubGlobal("fetch", async (url: string) => {
    if (!String(url).includes("/v1/chat/completions")) return new Response(JSON.stringify({ result: 2 }), { status: 200 });
    const body = streams[Math.min(calls++, streams.length - 1)]!;
    return new Response(body, { status: 200, headers: { "content-type": "text/event-stream" } });
  });
  return { calls: () => calls };
}

function run(boundaries: LoopState[] = []) {
  const driver: LoopDriver = {
    signal: new AbortController().signal,
    boundary: async (s) => void boundaries.push(s),
    model: (c) => c(),
    tool: (c) => c(),
    park: async () => undefined,
  };
  const endpoints = { policyUrl: "http://p", resourcesUrl: "http://r", stream: true };
  return runTurnLoop(endpoints, "r1", { expression: "1+1", tool_rounds: 0 }, null, seededState([{ role: "user", content: "Compute: 1+1" }]), driver);
}

describe("tool-calling agent, a streamed policy reply that ends in an error event", () => {
  it("is a failed call, sent again (it left no ledger row), never a final answer", async () => {
    const policy = streamedPolicy([failed, answered]);
    const boundaries: LoopState[] = [];
    const result = await run(boundaries);
    expect([result.answer, result.modelCalls, policy.calls()]).toEqual(["2", 1, 2]);
    expect(boundaries.map((b) => b.answer).filter((a) => a !== undefined)).toEqual(["2"]);
  });

  it("fails the activation upstream_failed once the calls sent again failed too", async () => {
    const policy = streamedPolicy([failed]);
    const boundaries: LoopState[] = [];
    expect(await refusalCode(run(boundaries))).toBe("upstream_failed");
    expect(policy.calls()).toBe(3);
    expect(boundaries.some((b) => b.answer !== undefined)).toBe(false);
  });
});
