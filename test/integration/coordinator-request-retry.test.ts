import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { monitorPhaseMessages, startWorld, type World } from "./coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
  // A try waits 300 ms at most, well inside the 5 s deadline.
  await (await world.startCoordinator({ request_attempt_ms: 300 })).whenReady();
});
afterAll(async () => {
  await world?.close();
});

describe("a participant request that goes unanswered", () => {
  it("is sent again within the deadline (request_attempt_ms), and the participant answers the retry once its first prepare is done", async () => {
    const tools = world.participant("tools").adapter;
    let release!: () => void;
    tools.delay("closeAdmission", new Promise<void>((resolve) => (release = resolve)));
    const monitor = monitorPhaseMessages(world.pnc, world.deployment);
    await world.pnc.flush();
    const reply = world.client.checkpoint({ checkpoint_id: "retried-1" });
    const preparesToTools = () => monitor.log.filter((m) => m.op === "prepare" && m.target === "resources/tools").length;
    await waitUntil(() => preparesToTools() >= 2, "the coordinator sent prepare to resources/tools again");
    release();
    expect((await reply).participants).toBe(5);
    monitor.stop();
    // Idempotent at the participant: admission was closed once, however many prepares arrived.
    expect(tools.calls.filter((c) => c.hook === "closeAdmission")).toHaveLength(1);
    expect(world.participant("tools").handle.controlPlane.currentPhase).toBe("idle");
  });
});
