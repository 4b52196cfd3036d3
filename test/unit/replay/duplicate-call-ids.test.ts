import { describe, expect, it } from "vitest";
import { isResumePoint, recheckSeed, toolCallSeeds, type Message } from "../../../participants/replay/index.js";
import { result, say, sys, TASK_PROMPT, TraceBuilder, user } from "./fixtures.js";

const ID = "0123abcd" + "f".repeat(24);

/** One turn issuing two different calls under one id: one result answers only one of them. */
const twoCallsOneId: Message = {
  role: "assistant",
  content: null,
  tool_calls: [
    { id: "a", name: "calculator", arguments: '{"expression":"1+1"}' },
    { id: "a", name: "calculator", arguments: '{"expression":"2+2"}' },
  ],
};

describe("a turn whose tool calls share an id", () => {
  it("is never a resume point with one result: the other call is unanswered", () => {
    expect(isResumePoint([user(TASK_PROMPT), twoCallsOneId, result("a")])).toBe(false);
  });

  it("offers no tool-call anchor after its run, and recheck cuts before it", () => {
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user(TASK_PROMPT)], [say("Let me compute."), true], [twoCallsOneId, true], [result("a")], [say("2"), true]]);
    const trace = b.trace(ID);
    expect(toolCallSeeds(trace, { maxAnchors: null, seed: 0 })).toEqual([]);
    expect(recheckSeed(trace, "Check it.")!.prompt).toEqual([user(TASK_PROMPT), say("Let me compute."), user("Check it.")]);
  });
});
