import { describe, expect, it } from "vitest";
import { AgentSessions } from "../../../participants/kinds/agent/index.js";
import { EpisodeSteps } from "../../../participants/kinds/environment/index.js";
import { ep } from "../../support/episode.js";

/**
 * `continuation()` hands episode code the restored boundary. Until the code records a boundary of
 * its own, that restored boundary is also what a checkpoint exports, so the code must get a copy:
 * mutating what it was handed (a turn loop appending to its messages) must not change the export.
 */
describe("continuation() returns a copy of the restored boundary", () => {
  it("environment steps: mutating the continuation leaves the exported boundary as restored", async () => {
    const steps = new EpisodeSteps();
    let finishStep!: () => void;
    const stepHeld = new Promise<void>((resolve) => (finishStep = resolve));
    const run = steps.run(ep("e1", 1), { data: undefined, restoredBoundary: { next: "verify", answer: "42", messages: ["S0"] } }, async (e) => {
      const c = e.continuation()!;
      c.next = "return";
      (c.messages as string[]).push("S1");
      // A replay step from the restored boundary: a checkpoint now exports the episode at it.
      await e.step("replay", () => stepHeld);
      return "done";
    });
    await new Promise((resolve) => setImmediate(resolve));
    steps.close();
    expect(steps.exportable().map((x) => x.boundary)).toEqual([{ next: "verify", answer: "42", messages: ["S0"] }]);
    finishStep();
    steps.open();
    expect(await run).toBe("done");
  });

  it("agent sessions: mutating an activation's continuation leaves the session's exported boundary as restored", async () => {
    const sessions = new AgentSessions(() => false);
    sessions.installRestored([{ key: "k1", episode: ep("k1", 1), boundary: { messages: ["S0"] } }]);
    await sessions.activate(ep("k1", 1), "k1", async (a) => {
      (a.continuation()!.messages as string[]).push("S1");
    });
    expect(sessions.exportable(null).map((s) => s.boundary)).toEqual([{ messages: ["S0"] }]);
  });
});
