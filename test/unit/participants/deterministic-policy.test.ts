import { describe, expect, it } from "vitest";
import { decide, type ChatRequest } from "../../../participants/gym/policy-backend/deterministic-policy.js";
import { DEFAULT_RECHECK_PROMPT } from "../../../participants/replay/replay-config.js";

/** The reference backend's fake policy: what it calls and answers for the Gym's conversations. */
const calculator = [{ type: "function", function: { name: "calculator" } }];
const system = { role: "system", content: "You are a careful calculator agent." };
const toolCall = (expression: string) => ({
  role: "assistant",
  content: null,
  tool_calls: [{ id: "c1", type: "function", function: { name: "calculator", arguments: JSON.stringify({ expression }) } }],
});
const request = (messages: ChatRequest["messages"]): ChatRequest => ({ messages, tools: calculator, metadata: { tool_rounds: "1" } });

describe("deterministic policy", () => {
  it("calls the calculator with the task's expression, then answers its result", () => {
    expect(decide(request([system, { role: "user", content: "Compute: 17 + 25" }]))).toMatchObject({ type: "tool_call", name: "calculator", arguments: '{"expression":"17 + 25"}' });
    const answered = decide(request([system, { role: "user", content: "Compute: 17 + 25" }, toolCall("17 + 25"), { role: "tool", tool_call_id: "c1", content: '{"result":42}' }]));
    expect(answered).toMatchObject({ type: "answer", content: "42" });
  });

  it("a recheck turn redoes the task's calculation and answers again, instead of computing the recheck prompt", () => {
    const finished = [system, { role: "user", content: "Compute: 10 * 2" }, toolCall("10 * 2"), { role: "tool", tool_call_id: "c1", content: '{"result":20}' }, { role: "assistant", content: "20" }];
    const recheck = [...finished, { role: "user", content: DEFAULT_RECHECK_PROMPT }];
    expect(decide(request(recheck))).toMatchObject({ type: "tool_call", arguments: '{"expression":"10 * 2"}' });
    const rechecked = decide(request([...recheck, toolCall("10 * 2"), { role: "tool", tool_call_id: "c1", content: '{"result":20}' }]));
    expect(rechecked).toMatchObject({ type: "answer", content: "20" });
  });

  it("without any Compute: turn the last user message is the expression, as before", () => {
    expect(decide(request([{ role: "user", content: " 6 * 7 " }]))).toMatchObject({ type: "tool_call", arguments: '{"expression":"6 * 7"}' });
  });
});
