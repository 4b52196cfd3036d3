/**
 * Reference rule (coordination order): resume runs stage by stage in reverse prepare order,
 * resources → agent → model → environment, and keeps going past failures, raising one combined
 * error at the end. Here over a real nats-server: a participant of a middle stage whose resume
 * fails does not keep the later stages parked, and a retry reaches the one that failed.
 */
import { describe, expect, it } from "vitest";
import type { Kind } from "../../protocol/index.js";
import { KIND_OF, hookLog, monitorPhaseMessages, worldWithLeader } from "./coordinator-harness.js";
import { refusalOf } from "../support/refusal.js";

const RESUME_RANK: Record<Kind, number> = { resources: 0, agent: 1, model: 2, environment: 3 };

const world = worldWithLeader();

describe("resume over a real nats-server", () => {
  it("a participant of a middle stage failing its resume neither stops the later stages nor hides the failure; a retry resumes it", async () => {
    const w = world();
    const prepared = await w.client.prepare({ checkpoint_id: "rpf-1" });
    expect(prepared.prepared).toBe(true);
    w.participant("agent1").adapter.failNext("openAdmission");
    hookLog.length = 0;
    const monitor = monitorPhaseMessages(w.pnc, w.deployment);
    await w.pnc.flush();
    const error = await refusalOf(w.client.resume({ checkpoint_id: "rpf-1" }));
    monitor.stop();
    expect(error.message).toContain("agent/agent1");
    // Every participant was sent its resume, stage by stage in reverse order, the failed one's later stages included.
    const resumes = monitor.log.filter((m) => m.op === "resume");
    expect(resumes.map((m) => m.target).sort()).toEqual(w.participants.map((p) => `${p.kind}/${p.instance}`).sort());
    const ranks = resumes.map((m) => RESUME_RANK[KIND_OF(m.target)]);
    expect(ranks).toEqual([...ranks].sort((a, b) => a - b));
    for (const p of w.participants) {
      if (p.instance === "agent1") expect(p.handle.controlPlane.currentPhase).not.toBe("idle");
      else expect(p.handle.controlPlane.currentPhase).toBe("idle");
    }
    expect(hookLog.filter((h) => h.startsWith("open:"))).toEqual(
      expect.arrayContaining(["open:resources/tools", "open:agent/agent2", "open:model/policy", "open:environment/env1"]),
    );
    // The retry goes to the participant still parked and releases it.
    const retry = monitorPhaseMessages(w.pnc, w.deployment);
    await w.pnc.flush();
    await w.client.resume({ checkpoint_id: "rpf-1" });
    retry.stop();
    expect(retry.log.filter((m) => m.op === "resume").map((m) => m.target)).toEqual(["agent/agent1"]);
    for (const p of w.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
    // The id is fenced everywhere, the one whose first resume failed included.
    expect((await refusalOf(w.client.prepare({ checkpoint_id: "rpf-1" }))).code).toBe("stale_checkpoint");
  });
});
