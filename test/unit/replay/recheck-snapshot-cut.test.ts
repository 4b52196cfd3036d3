import { describe, expect, it } from "vitest";
import { recheckSeed } from "../../../participants/replay/index.js";
import { call, result, say, sys, TASK_PROMPT, TraceBuilder, user } from "./fixtures.js";

const ID = "0123abcd" + "f".repeat(24);

/**
 * A recheck seed cut before a partly answered turn drops a tool result the sandbox already ran. The
 * final node's snapshot holds that result's effect, which the seeded conversation does not show.
 */
describe("recheck of a cut branch with snapshots", () => {
  // 0 sys, 1 user, 2 answer, 3 call(a, b), 4 result(a): the run of node 3 is partial, so the seed ends at 2.
  const cutTrace = (snapshots: Record<string, string>) => {
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user(TASK_PROMPT)], [say("It is 42."), true], [call("a", "b"), true], [result("a")]]);
    return b.trace(ID, { info: { snapshots } });
  };

  it("never restores the final node's sandbox when a tool result was cut from the seed", () => {
    expect(recheckSeed(cutTrace({ "4": "snap-after-a" }), "Check it.")).toBeNull();
  });

  it("anchors at the kept prefix's end, with its own snapshot, when it has one", () => {
    const seed = recheckSeed(cutTrace({ "2": "snap-answer", "4": "snap-after-a" }), "Check it.")!;
    expect(seed.prompt).toEqual([user(TASK_PROMPT), say("It is 42."), user("Check it.")]);
    expect(seed.anchorNode).toBe(2);
    expect(seed.snapshot).toBe("snap-answer");
  });

  it("keeps the final node's snapshot when only turns that ran nothing were dropped", () => {
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user(TASK_PROMPT)], [say("It is 42."), true], [user("continue")]]);
    const seed = recheckSeed(b.trace(ID, { info: { snapshots: { "3": "snap-final" } } }), "Check it.")!;
    expect(seed.snapshot).toBe("snap-final");
    expect(seed.anchorNode).toBe(3);
  });
});
