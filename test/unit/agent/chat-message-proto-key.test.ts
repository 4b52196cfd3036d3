import { afterEach, describe, expect, it, vi } from "vitest";
import { ChatMessageSchema, LoopStateSchema } from "../../../participants/gym/agent-server/tool-calling-agent.js";
import { runGymEpisode } from "../../../participants/gym/environment-server/gym-episode.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { describeZodError } from "../../../protocol/index.js";
import { ChatMessageLikeSchema } from "../../../participants/replay/chat-trajectory.js";

/**
 * Chat messages pass unknown keys through (a policy's or a seed's extras); one named `__proto__`
 * is data like any other. A turn-loop state is restored through LoopStateSchema, and the
 * environment reads an activation's conversation through its own schema: a schema that dropped
 * the key changed the conversation after a checkpoint's restore, or in the trajectory.
 */
const messageText = '{"role":"assistant","content":"42","__proto__":{"reasoning":"6*7"},"extra":{"__proto__":1}}';

afterEach(() => vi.unstubAllGlobals());

describe("chat messages keep a __proto__ key as data", () => {
  it("the agent's message schema keeps it, as an own key on a plain object", () => {
    const parsed = ChatMessageSchema.parse(JSON.parse(messageText));
    expect(Object.hasOwn(parsed, "__proto__")).toBe(true);
    expect(Object.getPrototypeOf(parsed)).toBe(Object.prototype);
    expect((parsed as Record<string, unknown>).reasoning).toBeUndefined();
    expect(JSON.parse(JSON.stringify(parsed))).toEqual(JSON.parse(messageText));
    expect(JSON.stringify(parsed)).toBe(messageText);
  });

  it("a turn-loop state keeps it through the checkpoint round trip (JSON text, then the restore's parse)", () => {
    const state = { messages: [{ role: "user", content: "Compute: 6 * 7" }, JSON.parse(messageText)], answer: "42" };
    const restored = LoopStateSchema.parse(JSON.parse(JSON.stringify(LoopStateSchema.parse(state))));
    expect(JSON.stringify(restored.messages[1])).toBe(messageText);
  });

  it("still refuses a message that is not one, naming where", () => {
    const refused = LoopStateSchema.safeParse({ messages: [{ role: "user", content: "x" }, { role: "robot", content: "y" }] });
    expect(refused.success).toBe(false);
    expect(refused.error!.issues[0]!.path).toEqual(["messages", 1, "role"]);
    expect(describeZodError(refused.error!)).toMatch(/messages\.1\.role|messages\[1\]\.role|role/);
    expect(ChatMessageSchema.safeParse(JSON.parse('{"role":"user","content":"x","__proto__":[1]}')).success).toBe(true);
  });

  it("the replay's chat message schema (a library export) keeps it, in the message and its tool calls", () => {
    const text =
      '{"role":"assistant","content":null,"__proto__":{"reasoning":"6*7"},"tool_calls":[{"id":"c1","type":"function","function":{"name":"calc","arguments":"{}","__proto__":2},"__proto__":[1]}]}';
    const parsed = ChatMessageLikeSchema.parse(JSON.parse(text));
    expect(Object.hasOwn(parsed, "__proto__")).toBe(true);
    expect(Object.getPrototypeOf(parsed)).toBe(Object.prototype);
    expect(JSON.stringify(parsed)).toBe(text);
    expect(ChatMessageLikeSchema.safeParse({ role: "user", tool_calls: [{ id: "c", type: "function", function: { name: 1 } }] }).error!.issues[0]!.path).toEqual([
      "tool_calls",
      0,
      "function",
      "name",
    ]);
  });

  it("the environment keeps it in the conversation an activation reports", async () => {
    vi.stubGlobal("fetch", async (url: string) => {
      const op = String(url).slice(String(url).lastIndexOf("/") + 1);
      const json = (text: string) => new Response(text, { status: 200 });
      if (op === "activate") return json(`{"answer":"42","model_calls":1,"continued":false,"messages":[{"role":"user","content":"Compute: 6 * 7"},${messageText}]}`);
      if (op === "verify") return json('{"reward":1}');
      if (op === "open_session") return json('{"session_key":"r1","restored":false}');
      return json("{}");
    });
    const env = new EnvironmentKind();
    const task = { expression: "6 * 7", tool_rounds: 1 };
    const result = await env.begin({ rollout_id: "r1", attempt: 0 }, task, {}, (ep) => runGymEpisode({ agentUrl: "http://agent", resourcesUrl: "http://resources" }, ep, task));
    expect(JSON.stringify(result.messages![1])).toBe(messageText);
  });
});
