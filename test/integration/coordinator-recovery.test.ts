import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { startWorld, type World } from "./coordinator-harness.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
});
afterAll(async () => {
  await world?.close();
});

const NO_HTTP = { http: { enabled: false, host: "127.0.0.1", port: 0 } };

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
