import { afterEach, describe, expect, it, vi } from "vitest";
import { runTurnLoop, type ChatMessage, type LoopDriver } from "../../../participants/gym/agent-server/tool-calling-agent.js";

afterEach(() => vi.unstubAllGlobals());

const driver: LoopDriver = {
  signal: new AbortController().signal,
  boundary: async () => undefined,
  model: (c) => c(),
  tool: (c) => c(),
  park: async () => undefined,
};

/**
 * The agent offers one tool, `calculator`. A policy that asks for another (a hallucinated name, a
 * tool of another environment) gets a tool error back, as OpenAI-style agents answer it; running
 * the calculator on its arguments instead would feed the policy a result for a call it never made.
 */
describe("a tool call naming a tool the agent does not offer", () => {
  it("is answered to the policy as a tool error and never reaches the calculator", async () => {
    const calculatorCalls: string[] = [];
    const policyRequests: ChatMessage[][] = [];
    vi.stubGlobal("fetch", async (url: string, init: { body: string }) => {
      if (String(url).includes("/v1/chat/completions")) {
        const messages = (JSON.parse(init.body) as { messages: ChatMessage[] }).messages;
        policyRequests.push(messages);
        const message =
          policyRequests.length === 1
            ? { role: "assistant", content: null, tool_calls: [{ id: "c1", type: "function", function: { name: "shell", arguments: '{"expression":"6*7"}' } }] }
            : { role: "assistant", content: "I cannot" };
        return new Response(JSON.stringify({ choices: [{ message }] }), { status: 200 });
      }
      calculatorCalls.push(init.body);
      return new Response(JSON.stringify({ result: 42 }), { status: 200 });
    });
    const result = await runTurnLoop({ policyUrl: "http://p", resourcesUrl: "http://r", stream: false }, "r1", { expression: "6*7", tool_rounds: 1 }, null, {
      messages: [
        { role: "system", content: "s" },
        { role: "user", content: "Compute: 6*7" },
      ],
    }, driver);
    expect(calculatorCalls).toEqual([]);
    const toolReply = policyRequests[1]!.at(-1)!;
    expect(toolReply).toMatchObject({ role: "tool", tool_call_id: "c1" });
    expect(JSON.parse(toolReply.content!)).toEqual({ error: 'unknown tool "shell": this agent offers calculator' });
    expect(result.answer).toBe("I cannot");
  });
});
