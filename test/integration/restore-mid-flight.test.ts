import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PARTICIPANT_TOKEN, hookLog, startWorld, type World } from "./coordinator-harness.js";
import { controlRequest } from "../support/control-requests.js";
import { refusalOf } from "../support/refusal.js";
import { waitUntil } from "../support/wait-until.js";

// Restores that something overtakes while an install runs at one participant: its deadline passes,
// or its process restarts. All or nothing: restore_failed, attempt+1 retired where it may have
// been installed, everyone idle, nothing restored left behind.

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
  await (await world.startCoordinator()).whenReady();
});
afterAll(async () => {
  await world?.close();
});

async function checkpointThenRestart(id: string, rollout: string): Promise<void> {
  for (const instance of ["env1", "policy", "agent1", "agent2", "tools"]) world.participant(instance).adapter.addEpisode({ rollout_id: rollout, attempt: 0 }, { n: 1 });
  await world.client.checkpoint({ checkpoint_id: id });
  await world.stopParticipants();
  await world.startParticipants();
  hookLog.length = 0;
}

function expectAllOrNothing(rollout: string): void {
  for (const p of world.participants) {
    expect(p.handle.controlPlane.currentPhase).toBe("idle");
    expect(p.adapter.restored.size).toBe(0);
    expect(p.adapter.admissionOpen).toBe(true);
    expect(p.handle.controlPlane.isRetired({ rollout_id: rollout, attempt: 1 })).toBe(true);
  }
}

describe("a restore overtaken mid-install", () => {
  it("the deadline passes while one participant installs: restore_failed, its late install freed once it ends, everyone resumed", async () => {
    await checkpointThenRestart("dl-1", "dl");
    let release!: () => void;
    world.participant("agent2").adapter.delay("install", new Promise<void>((r) => (release = r)));
    const deadline = Date.now() + 1500;
    const restoring = refusalOf(world.client.restore({ checkpoint_id: "dl-1", episode_ids: [{ rollout_id: "dl", attempt: 0 }], deadline_ts: deadline / 1000 }));
    // The install ends only once the deadline is past: it lands late, the clean-up must free it.
    await waitUntil(() => Date.now() > deadline + 200, "the restore's deadline to pass", 5000);
    release();
    const error = await restoring;
    expect(error.code).toBe("restore_failed");
    expect(error.message).toContain("agent/agent2");
    // The install that outlived its deadline is freed once it ends (it may end after the reply).
    await waitUntil(() => world.participant("agent2").adapter.restored.size === 0, "agent2's late install to be freed", 5000);
    expectAllOrNothing("dl");
  });

  it("leadership lost while one participant installs: the successor re-drives the restore, the controller's retry gets its reply and the resume continues", async () => {
    const scope = [{ rollout_id: "ll", attempt: 0 }];
    await checkpointThenRestart("ll-1", "ll");
    const first = world.coordinators.splice(0)[0]!;
    let release!: () => void;
    world.participant("agent2").adapter.delay("install", new Promise<void>((r) => (release = r)));
    const restoring = world.client.restore({ checkpoint_id: "ll-1", episode_ids: scope, deadline_ts: Date.now() / 1000 + 20 }).catch((error: unknown) => error);
    await waitUntil(() => world.participant("agent2").adapter.hooks().includes("install"), "agent2's install to start", 5000);
    // The leader goes away mid-restore (its lease released); a successor takes over and recovers.
    const stopping = first.stop();
    const second = await world.startCoordinator();
    const ready = second.whenReady();
    release();
    await Promise.all([stopping, ready]);
    const firstAnswer = await restoring;
    const retried = await world.client.restore({ checkpoint_id: "ll-1", episode_ids: scope, deadline_ts: Date.now() / 1000 + 10 });
    if (!(firstAnswer instanceof Error)) expect(retried).toEqual(firstAnswer);
    expect(retried.participants.find((p) => p.instance === "agent2")?.restored).toEqual(["ll-a1"]);
    await world.client.resume({ checkpoint_id: "ll-1" });
    for (const p of world.participants) {
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
      expect(p.adapter.restored.has("ll-a1")).toBe(true);
      expect(p.handle.controlPlane.isRetired({ rollout_id: "ll", attempt: 1 })).toBe(false);
    }
  });

  it("a restore whose deadline passes while it waits at a live process (its lock busy): that process refuses it as in time (not fresh, already resumed), so the clean-up fences none of the rollouts it runs", async () => {
    await checkpointThenRestart("lv-1", "lv");
    // The controller went on without it: attempt 1 of lv runs in these live processes.
    for (const p of world.participants) p.adapter.addEpisode({ rollout_id: "lv", attempt: 1 }, { n: 2 });
    // env1's lock is held by a slow forget (its hook waits) until the restore's deadline has passed.
    const env1 = world.participant("env1");
    let release!: () => void;
    env1.adapter.delay("forget", new Promise<void>((r) => (release = r)));
    const epoch = world.coordinators[0]!.lease.state().epoch!;
    const target = { deployment: world.deployment, kind: "environment" as const, instance: "env1", token: PARTICIPANT_TOKEN };
    const forgetting = controlRequest(world.pnc, target, "forget", { checkpoint_id: "forget", deadline_ts: Date.now() / 1000 + 20, epoch, rollout_ids: ["other"] });
    await waitUntil(() => env1.adapter.hooks().includes("forget"), "env1's forget to start", 5000);
    const deadline = Date.now() + 1000;
    const restoring = refusalOf(world.client.restore({ checkpoint_id: "lv-1", episode_ids: [{ rollout_id: "lv", attempt: 0 }], deadline_ts: deadline / 1000 }));
    await waitUntil(() => Date.now() > deadline + 100, "the restore's deadline to pass", 5000);
    release();
    await forgetting;
    const error = await restoring;
    // Refused everywhere as not fresh (env1 past its deadline too): answered as that refusal, nothing cleaned up.
    expect(error.code).toBe("invalid_checkpoint_state");
    expect(hookLog.filter((h) => h.startsWith("retire:"))).toEqual([]);
    for (const p of world.participants) {
      expect(p.handle.controlPlane.isRetired({ rollout_id: "lv", attempt: 1 })).toBe(false);
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
      expect(p.adapter.episodes.has("lv-a1")).toBe(true);
    }

    // Another restore of it, late at env1 again, is refused there as in time (not fresh); lw's attempt 1 runs on.
    for (const p of world.participants) p.adapter.addEpisode({ rollout_id: "lw", attempt: 1 }, { n: 2 });
    let releaseAgain!: () => void;
    env1.adapter.delay("forget", new Promise<void>((r) => (releaseAgain = r)));
    const forgettingAgain = controlRequest(world.pnc, target, "forget", { checkpoint_id: "forget", deadline_ts: Date.now() / 1000 + 20, epoch, rollout_ids: ["other"] });
    await waitUntil(() => env1.adapter.hooks().filter((h) => h === "forget").length === 2, "env1's second forget to start", 5000);
    hookLog.length = 0;
    const deadlineAgain = Date.now() + 1000;
    const again = refusalOf(world.client.restore({ checkpoint_id: "lv-1", episode_ids: [{ rollout_id: "lw", attempt: 0 }], deadline_ts: deadlineAgain / 1000 }));
    await waitUntil(() => Date.now() > deadlineAgain + 100, "the second restore's deadline to pass", 5000);
    releaseAgain();
    await forgettingAgain;
    const errorAgain = await again;
    expect(errorAgain.code).toBe("invalid_checkpoint_state");
    expect(hookLog.filter((h) => h.startsWith("retire:"))).toEqual([]);
    for (const p of world.participants) expect(p.handle.controlPlane.isRetired({ rollout_id: "lw", attempt: 1 })).toBe(false);
  });
});
