import { afterEach, describe, expect, it, vi } from "vitest";
import { recordingDriver } from "../../support/recording-driver.js";
import { runTurnLoop, seededState, type LoopState } from "../../../participants/gym/agent-server/tool-calling-agent.js";

/**
 * A policy that keeps calling tools and never answers (a real model looping on a task) spent the
 * agent's 16 turns and the activation failed internal_error, "an unexpected failure inside gym-ckpt":
 * the episode's /run answered 500 for a policy's behaviour, and a caller sending it again looped
 * again. The turn budget now ends the loop as an episode without an answer (verified, scored 0),
 * with a final boundary, so a restored activation returns it without calling the policy again.
 */
afterEach(() => vi.unstubAllGlobals());

function loopingPolicy(): { calls: () => number } {
  let calls = 0;
  vi.stubGlobal("fetch", async (url: string) => {
    if (!String(url).includes("/v1/chat/completions")) return new Response(JSON.stringify({ result: "2" }), { status: 200 });
    calls += 1;
    const message = { role: "assistant", content: null, tool_calls: [{ id: `c${calls}`, type: "function", function: { name: "calculator", arguments: '{"expression":"1+1"}' } }] };
    return new Response(JSON.stringify({ choices: [{ message }] }), { status: 200 });
  });
  return { calls: () => calls };
}


const endpoints = { policyUrl: "http://p", resourcesUrl: "http://r", stream: false };
const task = { expression: "1+1", tool_rounds: 1 };

describe("tool-calling agent, a policy that never answers", () => {
  it("ends after the turn budget without an answer, recorded in a final boundary", async () => {
    const policy = loopingPolicy();
    const boundaries: LoopState[] = [];
    const result = await runTurnLoop(endpoints, "r1", task, null, seededState([{ role: "user", content: "Compute: 1+1" }]), recordingDriver(boundaries));
    expect([result.answer, result.modelCalls, policy.calls()]).toEqual(["", 16, 16]);
    const final = boundaries.at(-1)!;
    expect(final.answer).toBe("");
    // Restored at that boundary, the activation answers the same and calls nobody.
    const again = await runTurnLoop(endpoints, "r1", task, null, final, recordingDriver([]));
    expect([again.answer, again.modelCalls, policy.calls()]).toEqual(["", 0, 16]);
  });
});
