import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KvDecisionJournal } from "../../coordinator/ha/decision-journal.js";
import { CheckpointError, type EpisodeId } from "../../protocol/index.js";
import type { ScriptRecord } from "../../participants/testing/scriptable-kind.js";
import { waitUntil } from "../support/wait-until.js";
import { NO_HTTP, startWorld, type World } from "./coordinator-harness.js";

// A kind's restore hook that fails part way and cannot free what it installed holds it as
// attempt+1 and answers internal_error, so the all-or-nothing clean-up retires attempt+1 there.
// When the leader died after that answer but before journaling its clean-up, the successor re-sent
// the journaled restore: the participant, holding state, refused it as not fresh
// (invalid_checkpoint_state), a refusal taken for "changed nothing", so attempt+1 was never retired
// there and the held state stayed for good.

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
});
afterAll(async () => {
  await world?.close();
});

describe("a restore that failed part way at one participant, its leader dead before the clean-up was journaled", () => {
  it("the successor's re-sent restore meets the same failure there and retires attempt+1 there too, freeing what it held", async () => {
    const first = await world.startCoordinator(NO_HTTP);
    await first.whenReady();
    const episode: EpisodeId = { rollout_id: "h1", attempt: 0 };
    const next: EpisodeId = { rollout_id: "h1", attempt: 1 };
    for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode(episode, { n: 1 });
    await world.client.checkpoint({ checkpoint_id: "hf-1", stop: true });
    await world.stopParticipants();
    await world.startParticipants(); // fresh processes, as a restore needs

    // agent1's install leaves attempt+1 installed (a free that failed) and answers internal_error,
    // once the leader is gone.
    const agent = world.participant("agent1").adapter;
    const install = agent.install.bind(agent);
    agent.install = async (records: ScriptRecord[]) => {
      await install(records);
      throw new CheckpointError("internal_error", "restoring failed part way; freeing failed too: held as attempt+1");
    };
    let release!: () => void;
    agent.delay("install", new Promise<void>((resolve) => (release = resolve)));
    const restoring = first.engine.restore({ checkpoint_id: "hf-1", episode_ids: [episode] }).then(
      () => "ok",
      (error: { code?: string }) => error.code,
    );
    await waitUntil(() => agent.hooks().includes("install"), "agent1's install", 5000);
    await first.lease.stop(true);
    release();
    expect(await restoring).not.toBe("ok");
    await waitUntil(() => agent.restored.has("h1-a1"), "agent1 holding attempt+1", 5000);
    const journal = await KvDecisionJournal.open(world.pnc, world.deployment);
    expect((await journal.list()).find((e) => e.checkpoint_id === "hf-1")?.state).toBe("restoring");
    await first.stop();

    const second = await world.startCoordinator(NO_HTTP);
    await second.whenReady();
    // Re-driven, failed at agent1 again, cleaned up there as everywhere it may have installed.
    expect((await world.client.status()).checkpoint).toBeNull();
    const states = world.participants.map((p) => [p.instance, p.handle.controlPlane.currentPhase, p.handle.controlPlane.isRetired(next), p.adapter.restored.size]);
    expect(states).toEqual(world.participants.map((p) => [p.instance, "idle", true, 0]));
    expect(await world.client.resume({ checkpoint_id: "hf-1" }).then(() => "ok", (error: { code?: string }) => error.code)).toBe("restore_failed");
  });
});
