/**
 * Reference rule (phase machine): retire and forget are allowed only in idle or restored, refused
 * while a checkpoint is open ("resume first"): stopping an episode waits for its final clean-up,
 * whose calls wait for resume, and a commit may still export what a retire would drop. Over a real
 * nats-server, both from the controller API and straight at a participant (a controller or tool
 * that bypasses the coordinator), with the participant's current epoch so only the phase refuses.
 */
import { describe, expect, it } from "vitest";
import { controlRequest } from "../support/control-requests.js";
import { refusalOf } from "../support/refusal.js";
import { PARTICIPANT_TOKEN, hookLog, monitorPhaseMessages, worldWithLeader } from "./coordinator-harness.js";

const world = worldWithLeader();
const R1 = { rollout_id: "rw1", attempt: 0 };

describe("retire and forget while a checkpoint is prepared", () => {
  it("are refused invalid_phase by the coordinator (nothing sent) and by a participant asked directly (no mark); the checkpoint still commits the attempt", async () => {
    const w = world();
    for (const instance of ["env1", "policy", "agent1"]) w.participant(instance).adapter.addEpisode(R1, { n: 1 });
    expect((await w.client.prepare({ checkpoint_id: "rw-1" })).prepared).toBe(true);
    hookLog.length = 0;
    const monitor = monitorPhaseMessages(w.pnc, w.deployment);
    await w.pnc.flush();
    expect((await refusalOf(w.client.retire({ episode_ids: [R1] }))).code).toBe("invalid_phase");
    expect((await refusalOf(w.client.forget({ rollout_ids: [R1.rollout_id] }))).code).toBe("invalid_phase");
    await w.pnc.flush();
    monitor.stop();
    expect(monitor.log).toEqual([]);

    const env = w.participant("env1");
    const epoch = env.handle.controlPlane.status().epoch;
    const target = { deployment: w.deployment, kind: "environment" as const, instance: "env1", token: PARTICIPANT_TOKEN };
    const deadline_ts = Date.now() / 1000 + 30;
    const retire = await controlRequest(w.pnc, target, "retire", { checkpoint_id: "retire", deadline_ts, epoch, episode_ids: [R1] });
    expect(retire).toMatchObject({ error: { code: "invalid_phase" } });
    const forget = await controlRequest(w.pnc, target, "forget", { checkpoint_id: "forget", deadline_ts, epoch, rollout_ids: [R1.rollout_id] });
    expect(forget).toMatchObject({ error: { code: "invalid_phase" } });
    expect(env.handle.controlPlane.isRetired(R1)).toBe(false);
    expect(env.handle.controlPlane.status().retired_rollouts).toBe(0);
    expect(env.handle.controlPlane.currentPhase).toBe("prepared");
    expect(hookLog.filter((h) => h.startsWith("retire:") || h.startsWith("forget:"))).toEqual([]);

    const committed = await w.client.commit({ checkpoint_id: "rw-1", episode_ids: [R1] });
    expect(committed.participants.length).toBeGreaterThan(0);
    await w.client.resume({ checkpoint_id: "rw-1" });
    // Once resumed, the same retire goes ahead.
    await w.client.retire({ episode_ids: [R1] });
    for (const p of w.participants) expect(p.handle.controlPlane.isRetired(R1)).toBe(true);
    await w.client.forget({ rollout_ids: [R1.rollout_id] });
  });
});
