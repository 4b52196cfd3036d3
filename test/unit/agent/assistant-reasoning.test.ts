import { afterEach, describe, expect, it, vi } from "vitest";
import { recordingDriver } from "../../support/recording-driver.js";
import {
  LoopStateSchema,
  assembleStream,
  initialState,
  runTurnLoop,
  type LoopState,
} from "../../../participants/gym/agent-server/tool-calling-agent.js";
import { conversationDigest } from "../../../participants/kinds/model/conversation-digest.js";

/**
 * The model's reasoning on the assistant turns the reference agent keeps: its boundaries (parked
 * conversations), its trajectory and what it sends back to the policy. It was dropped (the reply was
 * rebuilt from content and tool_calls), so a replay continuing from an anchor lacked it.
 */
afterEach(() => vi.unstubAllGlobals());

const endpoints = { policyUrl: "http://p", resourcesUrl: "http://r", stream: false };
const task = { expression: "6*7", tool_rounds: 1 };
const CALL = { id: "c1", type: "function", function: { name: "calculator", arguments: '{"expression":"6*7"}' } };

/** A policy whose first reply is a tool call and second the answer, each with `extra` keys; records every request body. */
function stubPolicy(extra: (turn: number) => Record<string, unknown>): { bodies: { messages: Record<string, unknown>[] }[] } {
  const seen = { bodies: [] as { messages: Record<string, unknown>[] }[] };
  vi.stubGlobal("fetch", async (url: string, init: { body: string }) => {
    if (!String(url).includes("/v1/chat/completions")) return new Response(JSON.stringify({ result: 42 }), { status: 200 });
    seen.bodies.push(JSON.parse(init.body));
    const turn = seen.bodies.length;
    const message = turn === 1 ? { role: "assistant", content: null, tool_calls: [CALL], ...extra(1) } : { role: "assistant", content: "42", ...extra(2) };
    return new Response(JSON.stringify({ choices: [{ message }] }), { status: 200 });
  });
  return seen;
}


describe("tool-calling agent: the model's reasoning", () => {
  it("keeps reasoning_content on the assistant turns of its boundaries, its trajectory and the next policy call", async () => {
    const seen = stubPolicy((turn) => ({ reasoning_content: `thought ${turn}` }));
    const boundaries: LoopState[] = [];
    const result = await runTurnLoop(endpoints, "r1", task, null, initialState(task), recordingDriver(boundaries));
    expect(result.answer).toBe("42");
    const assistant1 = { role: "assistant", content: null, reasoning_content: "thought 1", tool_calls: [CALL] };
    expect(result.messages[2]).toEqual(assistant1);
    expect(result.messages[4]).toEqual({ role: "assistant", content: "42", reasoning_content: "thought 2" });
    // The boundary before the second call (a parked conversation) and the final one hold it.
    expect(boundaries[1]!.messages[2]).toEqual(assistant1);
    expect(boundaries.at(-1)!.messages[4]).toEqual({ role: "assistant", content: "42", reasoning_content: "thought 2" });
    // Sent back as it was produced: the chat template renders it where the model produced it.
    expect(seen.bodies[1]!.messages[2]).toEqual(assistant1);
  });

  it("keeps newer vLLM's `reasoning` under the record format's name, reasoning_content", async () => {
    stubPolicy((turn) => ({ reasoning: `thought ${turn}` }));
    const result = await runTurnLoop(endpoints, "r1", task, null, initialState(task), recordingDriver([]));
    expect(result.messages[2]).toEqual({ role: "assistant", content: null, reasoning_content: "thought 1", tool_calls: [CALL] });
    expect(result.messages[4]).toEqual({ role: "assistant", content: "42", reasoning_content: "thought 2" });
  });

  it("takes `reasoning` where reasoning_content holds no text", async () => {
    stubPolicy((turn) => ({ reasoning_content: "", reasoning: `thought ${turn}` }));
    const result = await runTurnLoop(endpoints, "r1", task, null, initialState(task), recordingDriver([]));
    expect(result.messages[4]).toEqual({ role: "assistant", content: "42", reasoning_content: "thought 2" });
  });

  it("adds no key to a reply without reasoning (null included): such conversations and their digests are unchanged", async () => {
    const seen = stubPolicy(() => ({ reasoning_content: null }));
    const result = await runTurnLoop(endpoints, "r1", task, null, initialState(task), recordingDriver([]));
    expect(result.messages[2]).toEqual({ role: "assistant", content: null, tool_calls: [CALL] });
    expect(result.messages[4]).toEqual({ role: "assistant", content: "42" });
    expect(seen.bodies[1]!.messages[2]).toEqual({ role: "assistant", content: null, tool_calls: [CALL] });
  });

  it("a call continued from a restored boundary has the digest of the call parked there", async () => {
    const seen = stubPolicy((turn) => ({ reasoning_content: `thought ${turn}` }));
    const boundaries: LoopState[] = [];
    await runTurnLoop(endpoints, "r1", task, null, initialState(task), recordingDriver(boundaries));
    // The boundary before the second call, through a checkpoint's JSON and the restore's schema.
    const restored = LoopStateSchema.parse(JSON.parse(JSON.stringify(boundaries[1])));
    await runTurnLoop(endpoints, "r1-a1", task, null, restored, recordingDriver([]));
    expect(seen.bodies).toHaveLength(3);
    expect(seen.bodies[2]!.messages[2]).toMatchObject({ reasoning_content: "thought 1" });
    const route = "/ng-rollout/r1/v1/chat/completions";
    expect(conversationDigest(route, seen.bodies[2]!)).toBe(conversationDigest(route, seen.bodies[1]!));
  });

  it("a boundary parked before the agent kept reasoning (no reasoning_content) continues with the digest of the call cut there", async () => {
    // As the agent wrote it then: the assistant turn rebuilt from content and tool calls only.
    const parked = {
      messages: [
        ...initialState(task).messages,
        { role: "assistant", content: null, tool_calls: [CALL] },
        { role: "tool", tool_call_id: "c1", content: JSON.stringify({ result: 42 }) },
      ],
    };
    const cut = { messages: parked.messages }; // the call in flight at the checkpoint sent exactly these
    const seen = stubPolicy((turn) => ({ reasoning_content: `thought ${turn}` }));
    const restored = LoopStateSchema.parse(JSON.parse(JSON.stringify(parked)));
    const result = await runTurnLoop(endpoints, "r1-a1", task, null, restored, recordingDriver([]));
    expect(result.answer).toBe("42");
    const route = "/ng-rollout/r1-a1/v1/chat/completions";
    expect(seen.bodies[0]!.messages).toEqual(parked.messages); // no reasoning added to the old turns
    expect(conversationDigest(route, seen.bodies[0]!)).toBe(conversationDigest(route, cut));
  });
});

describe("tool-calling agent: streamed reasoning", () => {
  const sse = (...chunks: unknown[]) => [...chunks.map((c) => `data: ${JSON.stringify(c)}\n\n`), "data: [DONE]\n\n"].join("");
  const delta = (d: object) => ({ choices: [{ index: 0, delta: d }] });

  it("assembles reasoning_content deltas", () => {
    const text = sse(delta({ role: "assistant", content: "" }), delta({ reasoning_content: "six " }), delta({ reasoning_content: "sevens" }), delta({ content: "42" }));
    expect(assembleStream(text)).toEqual({ role: "assistant", content: "42", reasoning_content: "six sevens" });
  });

  it("assembles newer vLLM's `reasoning` deltas as reasoning_content, before a tool call", () => {
    const text = sse(delta({ reasoning: "use the " }), delta({ reasoning: "calculator" }), delta({ tool_calls: [{ index: 0, ...CALL }] }));
    expect(assembleStream(text)).toEqual({ role: "assistant", content: null, reasoning_content: "use the calculator", tool_calls: [CALL] });
  });

  it("takes the text once when a server sends it under both names", () => {
    const text = sse(delta({ reasoning_content: "a", reasoning: "a" }), delta({ reasoning_content: "b", reasoning: "b" }), delta({ content: "42" }));
    expect(assembleStream(text)).toEqual({ role: "assistant", content: "42", reasoning_content: "ab" });
  });

  // vLLM from `reasoning_content` → `reasoning` (vllm-project/vllm#27752) until the old name's removal (#33402):
  // every delta mirrors `reasoning` into `reasoning_content`, null in the content deltas too, so both names
  // carry each piece of text once. Concatenated by arrival, it would be doubled.
  it("takes vLLM's mirrored deltas (both names in every delta, null where there is none) once, in order", () => {
    const both = (text: string | null) => ({ reasoning: text, reasoning_content: text });
    const text = sse(delta({ role: "assistant", content: "", ...both(null) }), delta(both("six ")), delta(both("sevens")), delta({ content: "42", ...both(null) }));
    expect(assembleStream(text)).toEqual({ role: "assistant", content: "42", reasoning_content: "six sevens" });
  });

  it("adds no key to a stream without reasoning", () => {
    expect(assembleStream(sse(delta({ content: "42", reasoning_content: null })))).toEqual({ role: "assistant", content: "42" });
  });
});
