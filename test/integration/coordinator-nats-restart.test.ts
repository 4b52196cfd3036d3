import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startWorld, type World } from "./coordinator-harness.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
});
afterAll(async () => {
  await world?.close();
});

describe("nats-server killed and restarted on the same store", () => {
  it("the coordinator leads again (never at a lower epoch) and checkpoints with every participant; the earlier checkpoint stays listed", async () => {
    // Room for every try below: on a loaded machine a try can publish and still fail at its client
    // (a reply lost to the restart), and the next try's id would push "before-crash" out at retention 2.
    const coordinator = await world.startCoordinator({ http: { enabled: false, host: "127.0.0.1", port: 0 }, retention: 50 });
    await coordinator.whenReady();
    const first = await world.client.checkpoint({ checkpoint_id: "before-crash" });
    await world.nats.server.kill();
    await world.nats.server.restart();
    // leadership is re-established (the old lease key may survive the restart, or expire first)
    const end = Date.now() + 20_000;
    let second: Awaited<ReturnType<typeof world.client.checkpoint>> | undefined;
    while (!second) {
      try {
        second = await world.client.checkpoint({ checkpoint_id: `after-crash-${Date.now()}`, deadline_ts: Date.now() / 1000 + 3 });
      } catch (error) {
        if (Date.now() > end) throw error;
        await new Promise((resolve) => setTimeout(resolve, 200));
      }
    }
    expect(second.epoch).toBeGreaterThanOrEqual(first.epoch);
    expect(second.participants).toBe(5);
    expect((await world.client.list()).checkpoints.map((c) => c.checkpoint_id)).toContain("before-crash");
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  });
});
