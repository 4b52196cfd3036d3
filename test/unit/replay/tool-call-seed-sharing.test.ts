import { describe, expect, it } from "vitest";
import { recheckSeed, toolCallSeeds, type Message } from "../../../participants/replay/index.js";
import { call, result, say, sys, TASK_PROMPT, TraceBuilder, user } from "./fixtures.js";

const ID = "5eed5eed" + "b".repeat(24);
const ROUNDS = 40;

/** A linear agentic trace: ROUNDS tool rounds, then an answer. Every round ends a complete tool run. */
function longToolTrace() {
  const b = new TraceBuilder();
  const steps: Array<[Message, boolean?]> = [[sys()], [user(TASK_PROMPT)]];
  for (let i = 0; i < ROUNDS; i++) steps.push([call(`c${i}`), true], [result(`c${i}`, `out ${i}`)]);
  steps.push([say("42"), true]);
  b.chain(null, steps);
  return b.trace(ID);
}

describe("tool-call seeds of one record", () => {
  it("share one copy of each message: memory grows with the record, not with anchors × record", () => {
    const trace = longToolTrace();
    const seeds = toolCallSeeds(trace, { maxAnchors: null, seed: 0 });
    expect(seeds).toHaveLength(ROUNDS);
    const prompts = seeds.map((s) => s.prompt as Message[]);
    // Seed k holds the first 2k + 3 messages (system dropped); one copy each was k copies each,
    // ROUNDS² message copies for one record (a 0.4 MB record held 22 MB of seeds).
    const distinct = new Set(prompts.flat());
    expect(distinct.size).toBe(1 + 2 * ROUNDS);
    expect(prompts[ROUNDS - 1]![0]).toBe(prompts[0]![0]);
    expect(prompts[ROUNDS - 1]![2]).toBe(prompts[1]![2]);
  });

  it("keeps every task's prompt its own: the shared copies are not the record's and cannot be changed", () => {
    const trace = longToolTrace();
    const seeds = toolCallSeeds(trace, { maxAnchors: null, seed: 0 });
    const first = (seeds[0]!.prompt as Message[])[1]!;
    expect(first).not.toBe(trace.nodes[2]!.message);
    expect(first).toEqual(trace.nodes[2]!.message);
    expect(Object.isFrozen(first)).toBe(true);
    expect(() => {
      (first as { content: unknown }).content = "changed";
    }).toThrow(TypeError);
    const calls = (first as Extract<Message, { role: "assistant" }>).tool_calls!;
    expect(() => {
      calls[0]!.arguments = "{}";
    }).toThrow(TypeError);
    // Changing the record afterwards changes no seed.
    (trace.nodes[3]!.message as { content: unknown }).content = "rewritten";
    expect((seeds[1]!.prompt as Message[])[2]).toEqual(result("c0", "out 0"));
  });

  it("a recheck seed's prompt is read-only as well, as every task's is", () => {
    const prompt = recheckSeed(longToolTrace(), "Check it.")!.prompt as Message[];
    expect(Object.isFrozen(prompt)).toBe(true);
    expect(Object.isFrozen(prompt[1])).toBe(true);
    expect(() => prompt.push(say("more"))).toThrow(TypeError);
  });
});
