import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { EngineHooks } from "../../coordinator/engine/checkpoint-engine.js";
import { KvDecisionJournal } from "../../coordinator/ha/decision-journal.js";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { refusalOf } from "../support/refusal.js";
import { waitUntil } from "../support/wait-until.js";
import { NO_HTTP, hookLog, startWorld, type World } from "./coordinator-harness.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
});
afterAll(async () => {
  await world?.close();
});

describe("a new leader recovering a published checkpoint nobody resumed", () => {
  it("coordinator, controller and Gym servers all restart: restoring LATEST into the fresh processes works", async () => {
    const first = await world.startCoordinator(NO_HTTP);
    await first.whenReady();
    for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode({ rollout_id: "p1", attempt: 0 }, { n: 1 });
    await world.client.prepare({ checkpoint_id: "pub-1" });
    await world.client.commit({ checkpoint_id: "pub-1" });
    await world.client.publish({ checkpoint_id: "pub-1" });
    // Everything stops before the resume; the decided entry stays in the journal.
    await first.stop();
    await world.stopParticipants();
    await world.startParticipants();
    const second = await world.startCoordinator(NO_HTTP);
    await second.whenReady();
    expect(await new CheckpointCatalog(world.root).latest()).toBe("pub-1");
    const restored = await world.client.restore({ episode_ids: [{ rollout_id: "p1", attempt: 0 }] });
    expect(restored.checkpoint_id).toBe("pub-1");
    expect(restored.participants.find((p) => p.instance === "policy")?.restored).toEqual(["p1-a1"]);
    await world.client.resume({ checkpoint_id: "pub-1" });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  });
});

describe("a new leader recovering a checkpoint published by the fine-grained ops", () => {
  it("publish with another controller state is checkpoint_conflict at the successor too (docs/api.md: open or not), and checkpoint.json keeps the first", async () => {
    for (const c of world.coordinators.splice(0)) await c.stop(); // a leader of its own
    const first = await world.startCoordinator(NO_HTTP);
    await first.whenReady();
    await world.client.prepare({ checkpoint_id: "fp-1" });
    await world.client.commit({ checkpoint_id: "fp-1" });
    await world.client.publish({ checkpoint_id: "fp-1", controller_state: { inline: { step: 1 } } });
    const other = { checkpoint_id: "fp-1", controller_state: { inline: { step: 2 } } };
    expect((await refusalOf(world.client.publish(other))).code).toBe("checkpoint_conflict");
    // The leader dies before the resume: participants stay parked, the successor keeps it open as published.
    await first.stop();
    const second = await world.startCoordinator(NO_HTTP);
    await second.whenReady();
    expect((await world.client.status()).checkpoint).toMatchObject({ checkpoint_id: "fp-1", phase: "published" });
    expect((await refusalOf(world.client.publish(other))).code).toBe("checkpoint_conflict");
    expect((await new CheckpointCatalog(world.root).get("fp-1")).controller_state).toEqual({ inline: { step: 1 } });
    await world.client.resume({ checkpoint_id: "fp-1" });
  });
});

describe("a new leader recovering a restore its predecessor sent", () => {
  it("every participant restored, the leader died before journaling it: the successor sends it again, the controller's retry gets the reply, and the resume continues the episode", async () => {
    for (const c of world.coordinators.splice(0)) await c.stop(); // a leader of its own
    const first = await world.startCoordinator(NO_HTTP);
    await first.whenReady();
    const episode = { rollout_id: "q1", attempt: 0 };
    for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode(episode, { n: 2 });
    await world.client.checkpoint({ checkpoint_id: "rr-1", stop: true });
    await world.stopParticipants();
    await world.startParticipants(); // fresh processes, as a restore needs
    const restored = await world.client.restore({ checkpoint_id: "rr-1", episode_ids: [episode] });
    // The leader dies; its entry as it was before the restores went out (every one has arrived).
    await first.stop();
    const journal = await KvDecisionJournal.open(world.pnc, world.deployment);
    const entry = (await journal.list()).find((e) => e.checkpoint_id === "rr-1");
    expect(entry?.state).toBe("restored");
    await journal.record({ ...entry!, state: "restoring" });
    const second = await world.startCoordinator(NO_HTTP);
    await second.whenReady();
    // The controller saw outcome_unknown: its retry with the same id and scope gets the reply.
    expect(await world.client.restore({ checkpoint_id: "rr-1", episode_ids: [episode] })).toEqual(restored);
    await world.client.resume({ checkpoint_id: "rr-1" });
    for (const p of world.participants) {
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
      expect(p.handle.controlPlane.isRetired({ rollout_id: "q1", attempt: 1 })).toBe(false);
    }
    expect(world.participant("env1").adapter.restored.has("q1-a1")).toBe(true);
  });
});

describe("a restore whose controller or leader went away part way", () => {
  /** Leader `first` checkpoints `id` with one episode, every Gym server restarts, and `first` restores it there. */
  async function restoredIntoFreshProcesses(id: string, rollout: string, hooks?: EngineHooks) {
    for (const c of world.coordinators.splice(0)) await c.stop(); // a leader of its own
    const first = await world.startCoordinator(NO_HTTP, { hooks });
    await first.whenReady();
    const episode = { rollout_id: rollout, attempt: 0 };
    for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode(episode, { n: 2 });
    await world.client.checkpoint({ checkpoint_id: id, stop: true });
    await world.stopParticipants();
    await world.startParticipants();
    await world.client.restore({ checkpoint_id: id, episode_ids: [episode] });
    return { first, episode, next: { rollout_id: rollout, attempt: 1 } };
  }

  async function restartAllParticipants(): Promise<void> {
    await world.stopParticipants();
    await world.startParticipants();
  }

  it("re-driven by a successor, then abandoned by its controller: once every Gym server restarted, the next checkpoint goes ahead and no later leader installs it again", async () => {
    const { first, episode } = await restoredIntoFreshProcesses("ab-1", "ab");
    await first.stop();
    const journal = await KvDecisionJournal.open(world.pnc, world.deployment);
    const entry = (await journal.list()).find((e) => e.checkpoint_id === "ab-1")!;
    await journal.record({ ...entry, state: "restoring" }); // it died before journaling restored
    const second = await world.startCoordinator(NO_HTTP);
    await second.whenReady();
    expect((await world.client.status()).checkpoint).toMatchObject({ checkpoint_id: "ab-1", phase: "restored" });
    // Its controller took outcome_unknown for a failure: it retires the sources and moves on.
    await world.client.retire({ episode_ids: [episode] });
    await restartAllParticipants();
    expect((await world.client.prepare({ checkpoint_id: "ab-next" })).prepared).toBe(true);
    await world.client.resume({ checkpoint_id: "ab-next" });
    await waitUntil(async () => !(await journal.list()).some((e) => e.checkpoint_id === "ab-1"), "ab-1's journal entry removed", 5000);
    // A later leader finds nothing of ab-1 to re-drive into processes that never took part.
    await second.stop();
    const third = await world.startCoordinator(NO_HTTP);
    await third.whenReady();
    expect((await world.client.status()).checkpoint).toBeNull();
    for (const p of world.participants) {
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
      expect(p.adapter.restored.size).toBe(0);
    }
  });

  it("resumed, but the first removal of its journal entry failed (a KV timeout): retried before the resume answers, so after a later Gym server restart a successor retires none of the attempts the controller runs", async () => {
    let failRemovals = 0;
    const { first, next } = await restoredIntoFreshProcesses("ab-4", "ab4", {
      beforeJournalRemove: () => {
        if (failRemovals > 0 && failRemovals--) throw new Error("journal entry removal timed out (injected)");
      },
    });
    failRemovals = 1;
    const resumed = await world.client.resume({ checkpoint_id: "ab-4" });
    expect(resumed.participants.every((p) => p.idempotent === false)).toBe(true);
    expect(failRemovals).toBe(0);
    // The controller now runs ab4 as attempt 1, and no entry is left for a successor to act on.
    const journal = await KvDecisionJournal.open(world.pnc, world.deployment);
    expect((await journal.list()).map((e) => e.checkpoint_id)).not.toContain("ab-4");
    // Some time later a Gym server restarts (an ordinary crash), then the coordinator fails over.
    const old = world.participant("tools");
    await old.handle.stop();
    world.participants.splice(world.participants.indexOf(old), 1);
    await world.startParticipants([{ kind: "resources", instance: "tools" }]);
    await first.stop();
    const second = await world.startCoordinator(NO_HTTP);
    await second.whenReady();
    expect((await world.client.status()).checkpoint).toBeNull();
    expect(world.participants.filter((p) => p.handle.controlPlane.isRetired(next)).map((p) => p.instance)).toEqual([]);
  });

  it("journaled restored, every Gym server restarted before the successor recovers: closed without installing it into them", async () => {
    const { first } = await restoredIntoFreshProcesses("ab-2", "ab2");
    await first.stop();
    await restartAllParticipants();
    const second = await world.startCoordinator(NO_HTTP);
    await second.whenReady();
    expect((await world.client.status()).checkpoint).toBeNull();
    for (const p of world.participants) {
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
      expect(p.adapter.restored.size).toBe(0);
    }
    expect((await world.client.prepare({ checkpoint_id: "ab2-next" })).prepared).toBe(true);
    await world.client.resume({ checkpoint_id: "ab2-next" });
  });

  it("the resume's clean-up (a Gym server restarted since the restore) cut short by the leader's death: the successor finishes it, and the resume's retry answers restore_failed", async () => {
    const { first, next } = await restoredIntoFreshProcesses("ab-3", "ab3");
    // agent2 restarts between the restore and its resume: it lost what it restored.
    const old = world.participant("agent2");
    await old.handle.stop();
    world.participants.splice(world.participants.indexOf(old), 1);
    const [fresh] = await world.startParticipants([{ kind: "agent", instance: "agent2" }]);
    await waitUntil(() => first.members.incarnationOf?.({ kind: "agent", instance: "agent2" }) === fresh!.handle.controlPlane.incarnation, "the restart in the leader's view", 5000);
    // The clean-up's first retire stage (env1) is held while the leader dies.
    let release!: () => void;
    world.participant("env1").adapter.delay("retire", new Promise<void>((resolve) => (release = resolve)));
    const mark = hookLog.length;
    const resumed = first.engine.resume({ checkpoint_id: "ab-3" }).then(
      () => "ok",
      (error: { code?: string }) => error.code,
    );
    await waitUntil(() => hookLog.slice(mark).includes("retire:environment/env1"), "the clean-up's retire at env1", 5000);
    await first.lease.stop(true);
    release();
    expect(await resumed).toBe("outcome_unknown");
    expect(world.participant("env1").handle.controlPlane.isRetired(next)).toBe(true);
    expect(world.participant("agent1").handle.controlPlane.isRetired(next)).toBe(false); // cut short there
    await first.stop();
    const second = await world.startCoordinator(NO_HTTP);
    await second.whenReady();
    // Finished, not re-driven: attempt+1 retired everywhere, everyone resumed.
    expect((await world.client.status()).checkpoint).toBeNull();
    for (const p of world.participants) {
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
      expect(p.handle.controlPlane.isRetired(next)).toBe(true);
    }
    expect(await world.client.resume({ checkpoint_id: "ab-3" }).then(() => "ok", (error: { code?: string }) => error.code)).toBe("restore_failed");
  });
});
