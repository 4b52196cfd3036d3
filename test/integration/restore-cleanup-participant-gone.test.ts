import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { hookLog, startWorld, NO_HTTP, type World } from "./coordinator-harness.js";
import { refusalOf } from "../support/refusal.js";
import { waitUntil } from "../support/wait-until.js";

// A failed restore's clean-up with a participant that stopped for good after it restored: its
// membership entry is gone, so the clean-up sends it nothing more and answers restore_failed at
// once, naming it as not retired. Before, the clean-up's resume was sent there again until the
// clean-up's window closed (max(deadline, now + 30 s)), and the controller waited that long; its
// retire (no responders) was neither sent again nor named.

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
  await (await world.startCoordinator(NO_HTTP)).whenReady();
});
afterAll(async () => {
  await world?.close();
});

describe("a failed restore's clean-up at a participant that stopped for good", () => {
  it("gives it up once the registry no longer lists it: restore_failed without waiting out the window, naming it as not retired", async () => {
    for (const p of world.participants) p.adapter.addEpisode({ rollout_id: "gone", attempt: 0 }, { n: 1 });
    await world.client.checkpoint({ checkpoint_id: "gone-1" });
    await world.stopParticipants();
    await world.startParticipants();
    hookLog.length = 0;
    const coordinator = world.coordinators[0]!;
    await waitUntil(() => world.participants.every((p) => coordinator.members.incarnationOf(p) === p.handle.controlPlane.incarnation), "the fresh processes in the view");
    // env1's install fails, once tools has restored and stopped.
    const env1 = world.participant("env1");
    let release!: () => void;
    env1.adapter.delay("install", new Promise<void>((r) => (release = r)));
    env1.adapter.failNext("install");
    const restoring = refusalOf(world.client.restore({ checkpoint_id: "gone-1", episode_ids: [{ rollout_id: "gone", attempt: 0 }], deadline_ts: Date.now() / 1000 + 20 }));
    const tools = world.participant("tools");
    await waitUntil(() => tools.handle.controlPlane.currentPhase === "restored", "tools to restore");
    await tools.handle.stop(); // a clean stop deletes its membership entry
    world.participants.splice(world.participants.indexOf(tools), 1);
    await waitUntil(() => coordinator.members.incarnationOf(tools) === undefined, "tools gone from the view");
    const released = Date.now();
    release();
    const error = await restoring;
    expect(error.code).toBe("restore_failed");
    expect(Date.now() - released).toBeLessThan(10_000); // not the clean-up's 30 s window
    expect(error.message).toMatch(/^attempt\+1 could not be retired at resources\/tools \(unreachable: [^)]*\) \(not in the membership registry any more/);
    expect(error.message).toMatch(/resume did not get through at resources\/tools/);
    for (const p of world.participants) {
      expect(p.handle.controlPlane.currentPhase).toBe("idle");
      expect(p.adapter.restored.size).toBe(0);
    }
  });
});
