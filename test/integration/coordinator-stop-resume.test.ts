import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startWorld, type World } from "./coordinator-harness.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
  const coordinator = await world.startCoordinator();
  await coordinator.whenReady();
});
afterAll(async () => {
  await world?.close();
});

/**
 * A `stop` checkpoint leaves the participants parked on purpose. If the controller (or an operator:
 * docs/operations.md's token rotation starts with `gym-ckpt checkpoint --stop`) then decides to go
 * on after all, `resume <id>` is the documented way to release them. The coordinator that published
 * it answers success but sends nothing: every participant stays parked until its lease expires
 * (deadline + 600 s). A coordinator that did not publish it (after a restart) would resume them
 * (resume of an id it has neither open nor closed asks every participant's status).
 */
describe("resume of a published stop checkpoint", () => {
  it("releases the participants still parked in it", async () => {
    await world.client.checkpoint({ checkpoint_id: "stop-1", stop: true });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("committed");
    const reply = await world.client.resume({ checkpoint_id: "stop-1" });
    const phases = world.participants.map((p) => `${p.kind}/${p.instance}:${p.handle.controlPlane.currentPhase}`);
    expect({ resumed: reply.participants.length, phases }).toEqual({
      resumed: world.participants.length,
      phases: world.participants.map((p) => `${p.kind}/${p.instance}:idle`),
    });
  }, 30_000);
});
