import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KvDecisionJournal } from "../../coordinator/ha/decision-journal.js";
import { CheckpointError, type EpisodeId } from "../../protocol/index.js";
import { waitUntil } from "../support/wait-until.js";
import { NO_HTTP, startWorld, type World } from "./coordinator-harness.js";

// Coordinator A cleans up a failed restore (restore_failed) and loses the lease; its successor B
// restores the same checkpoint into fresh processes and resumes it; A wins the lease back. The
// controller's resume, its reply from B lost, is retried at A. Before, A answered it from its own
// memory of the earlier term (restore_failed): the controller restarted from input rollouts the Gym
// was continuing as attempt+1. B's removal of its journal entry now records the outcome.

let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
});
afterAll(async () => {
  await world?.close();
});

/** Until `coordinator` serves controller ops: it leads, and its recovery ran. */
const serving = (coordinator: World["coordinators"][number]) =>
  waitUntil(() => coordinator.lease.state().ready && coordinator.engine.recovered, "the coordinator to serve", 10_000);

async function freshProcesses(): Promise<void> {
  await world.stopParticipants();
  await world.startParticipants();
}

describe("a restore cleaned up by a coordinator, restored and resumed by its successor, its resume retried once the first leads again", () => {
  it("is answered as resumed (the successor's outcome, from the journal), not restore_failed from the first's memory", async () => {
    const first = await world.startCoordinator(NO_HTTP);
    await first.whenReady();
    const episode: EpisodeId = { rollout_id: "o1", attempt: 0 };
    for (const instance of ["env1", "policy", "agent1"]) world.participant(instance).adapter.addEpisode(episode, { n: 1 });
    await world.client.checkpoint({ checkpoint_id: "ro-1", stop: true });
    await freshProcesses();
    world.participant("env1").adapter.install = async () => {
      throw new CheckpointError("storage_error", "EIO (scripted)");
    };
    await waitUntil(() => world.participants.every((p) => first.members.incarnationOf(p) === p.handle.controlPlane.incarnation), "the fresh processes in the view");
    expect(await world.client.restore({ checkpoint_id: "ro-1", episode_ids: [episode] }).then(() => "ok", (error: { code?: string }) => error.code)).toBe("restore_failed");

    // The first loses its lease (a renewal fails) and cannot win it back until the test says so.
    const second = await world.startCoordinator(NO_HTTP);
    const lease = first.lease as unknown as { kv: { update: (...args: unknown[]) => Promise<number>; create: (...args: unknown[]) => Promise<number> } };
    const { update, create } = lease.kv;
    let campaigning = false;
    lease.kv.create = (...args) => (campaigning ? create.apply(lease.kv, args) : Promise.reject(new Error("TIMEOUT (scripted)")));
    lease.kv.update = (...args) => {
      lease.kv.update = update;
      return Promise.reject(new Error("TIMEOUT (scripted)"));
    };
    await waitUntil(() => !first.lease.state().leader, "the first to lose its lease", 10_000);
    await serving(second);

    // The successor restores it into fresh processes and resumes it; its entry goes.
    await freshProcesses();
    await waitUntil(() => world.participants.every((p) => second.members.incarnationOf(p) === p.handle.controlPlane.incarnation), "the fresh processes in the successor's view");
    await world.client.restore({ checkpoint_id: "ro-1", episode_ids: [episode] });
    await world.client.resume({ checkpoint_id: "ro-1" });
    const journal = await KvDecisionJournal.open(world.pnc, world.deployment);
    expect((await journal.list()).map((e) => e.checkpoint_id)).toEqual([]);
    expect(await journal.restoreOutcome("ro-1")).toBe("restored");

    // The successor stops; the first leads again and takes the controller's retried resume.
    campaigning = true;
    await second.stop();
    await serving(first);
    await expect(world.client.resume({ checkpoint_id: "ro-1" })).resolves.toEqual({ checkpoint_id: "ro-1", participants: [] });
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  });
});
