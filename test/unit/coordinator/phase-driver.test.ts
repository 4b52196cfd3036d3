import { describe, expect, it } from "vitest";
import { membersOf, runStages } from "../../../coordinator/engine/phase-driver.js";
import type { Kind } from "../../../protocol/index.js";

type Member = { kind: Kind; instance: string };
const ok = { ok: true } as const;
const m = (kind: Kind, instance: string): Member => ({ kind, instance });

describe("the staged fan-out", () => {
  it("runs the members of the given kinds in instance order, and skips a stage nobody is in", async () => {
    const members = [m("agent", "b"), m("model", "m"), m("agent", "a"), m("environment", "e")];
    expect(membersOf(members, ["agent"]).map((x) => x.instance)).toEqual(["a", "b"]);
    const called: string[] = [];
    const run = await runStages([["resources"], ["model"], ["agent", "environment"]], members, async (x) => (called.push(x.instance), ok), { spanName: "t" });
    // A one-member stage is a stage; the empty one leaves no result.
    expect(run.results.map((r) => [r.stage, r.outcomes.length])).toEqual([
      [["model"], 1],
      [["agent", "environment"], 3],
    ]);
    expect(run.stoppedAt).toBeNull();
    expect(called).toEqual(["m", "a", "b", "e"]);
  });

  // A failed restore's clean-up gives each retire stage its share of the window by this count.
  it("tells each call how many stages are still to run in turn, its own included (empty ones not counted; 1 once sent at once)", async () => {
    const members = [m("environment", "e"), m("agent", "a"), m("model", "m")];
    const inTurn: string[] = [];
    await runStages([["environment"], ["resources"], ["agent"], ["model"]], members, async (x, _ctx, left) => (inTurn.push(`${x.instance}${left}`), ok), { spanName: "t" });
    expect(inTurn).toEqual(["e3", "a2", "m1"]);
    const atOnce: string[] = [];
    let sent = 0;
    await runStages([["environment"], ["agent"], ["model"]], members, async (x, _ctx, left) => (atOnce.push(`${x.instance}${left}`), sent++, ok), { spanName: "t", allAtOnce: () => sent > 0 });
    expect(atOnce).toEqual(["e3", "a1", "m1"]);
  });

  // Prepare passes the decision journal's write as `gate`: the first stage overlaps it, every later
  // stage waits for it. Pins both halves: the first non-empty stage (an empty one before it does not
  // count) starts before the gate opens, and the second does not.
  it("awaits the gate only before the stages after the first", async () => {
    let open!: () => void;
    const gate = new Promise<void>((resolve) => (open = resolve));
    let opened = false;
    const started: string[] = [];
    const run = runStages([["resources"], ["model"], ["agent"]], [m("model", "m"), m("agent", "a")], async (x) => {
      started.push(`${x.instance}${opened ? "+gate" : ""}`);
      if (x.kind === "model") setImmediate(() => ((opened = true), open()));
      return ok;
    }, { spanName: "t", gate });
    await run;
    expect(started).toEqual(["m", "a+gate"]);
  }, 5_000); // bounded: a first stage that waited for the gate would wait for ever

  it("stops after a stage `proceed` refuses, and runs the next one when it accepts", async () => {
    const members = [m("model", "m"), m("agent", "a")];
    const stopped = await runStages([["model"], ["agent"]], members, async () => ok, { spanName: "t", proceed: () => false });
    expect([stopped.results.length, stopped.stoppedAt]).toEqual([1, ["model"]]);
    const all = await runStages([["model"], ["agent"]], members, async () => ok, { spanName: "t", proceed: () => true });
    expect([all.results.length, all.stoppedAt]).toEqual([2, null]);
  });
});
