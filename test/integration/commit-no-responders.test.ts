import { existsSync } from "node:fs";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NO_HTTP, startWorld, type World } from "./coordinator-harness.js";
import { refusalOf } from "../support/refusal.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
});
afterAll(async () => {
  await world?.close();
});

describe("a participant whose process stops between the commit decision and the commits", () => {
  it("is unreachable at once (no responders, no retry until the deadline): nothing published, the others resumed", async () => {
    const gone = world.participant("agent2");
    let armed = true;
    const coordinator = await world.startCoordinator(
      NO_HTTP,
      {
        hooks: {
          afterDecision: async () => {
            if (!armed) return;
            armed = false;
            await gone.handle.stop();
            await world.pnc.flush(); // its unsubscribe reached the server
          },
        },
      },
    );
    await coordinator.whenReady();
    // No subscription watches the participant subjects here: any subscriber counts as a responder.
    const started = Date.now();
    const error = await refusalOf(world.client.checkpoint({ checkpoint_id: "gone-at-commit", deadline_ts: Date.now() / 1000 + 30 }));
    expect(Date.now() - started).toBeLessThan(10_000); // not the 30 s deadline
    expect(error.code).toBe("unreachable");
    expect(error.message).toContain("agent/agent2");
    expect(existsSync(join(world.root, "LATEST"))).toBe(false);
    expect(existsSync(join(world.root, "gone-at-commit", "checkpoint.json"))).toBe(false);
    for (const p of world.participants.filter((q) => q !== gone)) expect(`${p.instance}:${p.handle.controlPlane.currentPhase}`).toBe(`${p.instance}:idle`);
  }, 60_000);
});
