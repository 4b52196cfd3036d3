import { describe, expect, it } from "vitest";
import { createPolicyBackend } from "../../../participants/gym/policy-backend/policy-backend.js";
import { assembleStream } from "../../../participants/gym/agent-server/tool-calling-agent.js";

/**
 * The reference backend as a reasoning model (`reasoning`: the field it names, as vLLM's reasoning
 * parsers do): each reply carries a deterministic thought beside its content or tool call.
 */
const TOOLS = [{ type: "function", function: { name: "calculator" } }];
const FIRST = [
  { role: "system", content: "sys" },
  { role: "user", content: "Compute: 17 + 25" },
];
const CALL = { id: "call_1", type: "function", function: { name: "calculator", arguments: '{"expression":"17 + 25"}' } };
const SECOND = [...FIRST, { role: "assistant", content: null, tool_calls: [CALL] }, { role: "tool", tool_call_id: "call_1", content: '{"result":"42"}' }];

async function withBackend(reasoning: "reasoning_content" | "reasoning" | undefined, test: (chat: (body: object) => Promise<{ body: string; json: () => any }>) => Promise<void>) {
  const { app } = await createPolicyBackend({ cutToken: "cut-token", ...(reasoning && { reasoning }) });
  try {
    await test((body) => app.inject({ method: "POST", url: "/v1/chat/completions", payload: body }));
  } finally {
    await app.close();
  }
}

describe("reference policy backend reasoning", () => {
  it("puts its thought under the named field of a non-streamed tool call and answer", async () => {
    await withBackend("reasoning_content", async (chat) => {
      const call = (await chat({ messages: FIRST, tools: TOOLS })).json().choices[0].message;
      expect(call).toEqual({ role: "assistant", content: null, reasoning_content: 'Call calculator with {"expression":"17 + 25"}.', tool_calls: [CALL] });
      const answer = (await chat({ messages: SECOND, tools: TOOLS })).json().choices[0].message;
      expect(answer).toEqual({ role: "assistant", content: "42", reasoning_content: "Answer 42." });
    });
  });

  it("streams it as a delta of its own, before the content, under newer vLLM's name too", async () => {
    await withBackend("reasoning", async (chat) => {
      const text = (await chat({ messages: SECOND, tools: TOOLS, stream: true })).body;
      const deltas = text.split("\n").filter((l) => l.startsWith("data: {")).map((l) => JSON.parse(l.slice(6)).choices[0].delta);
      expect(deltas.findIndex((d) => "reasoning" in d)).toBeLessThan(deltas.findIndex((d) => typeof d.content === "string" && d.content.length > 0));
      expect(assembleStream(text)).toEqual({ role: "assistant", content: "42", reasoning_content: "Answer 42." });
    });
  });

  it("sends none by default", async () => {
    await withBackend(undefined, async (chat) => {
      expect((await chat({ messages: FIRST, tools: TOOLS })).json().choices[0].message).toEqual({ role: "assistant", content: null, tool_calls: [CALL] });
      expect((await chat({ messages: FIRST, tools: TOOLS, stream: true })).body).not.toContain("reasoning");
    });
  });
});
