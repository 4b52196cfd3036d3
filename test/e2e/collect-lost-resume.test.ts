import { describe, expect, it } from "vitest";
import { startControllerRelay } from "../support/controller-relay.js";
import { collectHarness } from "./collect-processes.js";

/**
 * A checkpoint's resume that never reaches the coordinator while the collector lives on (its
 * coordinator SIGKILLed between publish and resume): nothing else resumes a published checkpoint,
 * so the collector must send it again, or every row stays parked until the participants' lease
 * (120 s in this world) expires.
 */
const { setUp, startCollector, resultLines } = collectHarness();

describe("collect whose checkpoint resume is lost", () => {
  it("the first resume is held by the relay: sent again, every row finishes once well before the participants' lease expires", { timeout: 90_000 }, async () => {
    const w = await setUp(3);
    await w.backend.hold(1);
    const relay = await startControllerRelay(w, (op, n) => (op === "resume" && n === 1 ? "hold" : "pass"));
    const out: string[] = [];
    // 5 s: the held resume answers outcome_unknown after its deadline plus the client's 10 s slack.
    const collector = await startCollector(w, ["--deployment", relay.deployment, "--checkpoint-timeout-s", "5"], out);
    await w.waitFor(async () => (await w.backend.calls()).length >= 4, "rows running");
    const held = relay.when((op, action) => op === "resume" && action === "hold");
    collector.child.kill("SIGUSR1");
    await held;
    await w.backend.release();
    const exited = await Promise.race([collector.exited, new Promise((resolve) => setTimeout(() => resolve("still running after 50 s"), 50_000))]);
    await relay.close();
    expect(exited, out.join("\n")).toEqual({ code: 0, signal: null });
    expect((await resultLines(w)).map((l) => l.rollout_id).sort()).toEqual(["r0", "r1", "r2"]);
    expect(relay.seen.filter((s) => s.op === "resume").map((s) => s.action)).toEqual(["hold", "pass"]);
  });
});
