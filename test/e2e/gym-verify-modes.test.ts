import { afterEach, describe, expect, it } from "vitest";
import { FsCheckpointStorage } from "../../participants/storage/fs-storage.js";
import { EnvironmentRecordSchema } from "../../participants/kinds/environment/index.js";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { startGymWorld, type GymWorld } from "../support/gym-processes.js";
import { ep } from "../support/episode.js";
import { verifyHold } from "../support/verify-hold.js";

/**
 * Steps in flight at a checkpoint: verification in `replay` mode (the checkpoint does not wait; the
 * step runs again after a crash) vs `wait` mode (the checkpoint waits; the boundary after it is
 * recorded), and an episode finishing during prepare (neither lost nor redone).
 */
let world: GymWorld | undefined;

afterEach(async () => {
  await world?.close();
  world = undefined;
});

async function resources(path: string): Promise<any> {
  const response = await fetch(`${world!.gym.urls.resources}${path}`);
  return response.json();
}

async function environmentRecords(id: string) {
  const read = await new FsCheckpointStorage().read(
    { checkpointDir: new CheckpointCatalog(world!.root).dirFor(id), checkpointId: id, kind: "environment", instance: world!.gym.instances.environment },
    EnvironmentRecordSchema,
  );
  return read.records;
}

const soon = (seconds: number) => Date.now() / 1000 + seconds;

describe("verify in flight", () => {
  it("replay: an early prepare succeeds, the boundary is {next:'verify'}, and verify runs again after the crash", async () => {
    world = await startGymWorld();
    await verifyHold(world!.gym.urls.resources!, true);
    const lost = world.run("verify-1").catch(() => undefined);
    await world.waitFor(async () => (await resources("/admin/stats")).verify_started === 1, "verify to start");
    const prepared = await world.client.prepare({ checkpoint_id: "cp-replay", deadline_ts: soon(1) });
    expect(prepared.prepared).toBe(true);
    await world.client.commit({ checkpoint_id: "cp-replay", episode_ids: [ep("verify-1")] });
    await world.client.publish({ checkpoint_id: "cp-replay" });
    expect((await environmentRecords("cp-replay")).map((r) => r.boundary?.next)).toEqual(["verify"]);
    await world.crashAndRestart("cp-replay");
    await lost;
    await world.restoreAndResume("cp-replay", [ep("verify-1")]);
    expect((await world.run("verify-1", 1)).body).toMatchObject({ reward: 1, continued_from: "verify" });
    expect(await resources("/admin/stats")).toMatchObject({ verify_started: 1, verify_finished: 1 });
    expect((await world.backend.calls()).map((c) => c.message_count)).toEqual([2, 4]);
  });

  it("wait: an early prepare reports the episode as a blocker; the episode finishing during prepare is neither lost nor redone", async () => {
    world = await startGymWorld({ args: { resources: ["--verify", "wait"] } });
    await verifyHold(world!.gym.urls.resources!, true);
    let delivered: any;
    // The crash loses this /run; its rejection is expected and handled at once.
    const first = world.run("verify-1").then(
      (r) => (delivered = r.body),
      () => undefined,
    );
    await world.waitFor(async () => (await resources("/admin/stats")).verify_started === 1, "verify to start");
    const early = await world.client.prepare({ checkpoint_id: "cp-early", deadline_ts: soon(1) });
    expect(early.prepared).toBe(false);
    expect(early.blockers.filter((b) => b.kind === "environment").map((b) => b.blockers)).toEqual([["verify-1"]]);
    await world.client.resume({ checkpoint_id: "cp-early" });

    // The episode finishes while Gym prepares: its result is not delivered; it waits at {next:"return"}.
    const preparing = world.client.prepare({ checkpoint_id: "cp-wait", deadline_ts: soon(20) });
    await world.waitFor(async () => (await world!.status("environment")).phase !== "idle", "the environment to close admission");
    await verifyHold(world!.gym.urls.resources!, false);
    expect((await preparing).prepared).toBe(true);
    await world.waitFor(async () => (await world!.state("environment")).states.parked === 1, "the episode to park at return");
    expect(delivered).toBeUndefined();
    await world.client.commit({ checkpoint_id: "cp-wait", episode_ids: [ep("verify-1")] });
    await world.client.publish({ checkpoint_id: "cp-wait" });
    expect((await environmentRecords("cp-wait")).map((r) => r.boundary)).toEqual([{ next: "return", cookie: expect.any(String), answer: "42", reward: 1 }]);
    await world.verify("cp-wait");

    // Crash: the replacement returns the recorded result without verifying or calling the model again.
    await world.crashAndRestart("cp-wait");
    await first;
    expect(delivered).toBeUndefined();
    await world.restoreAndResume("cp-wait", [ep("verify-1")]);
    expect((await world.run("verify-1", 1)).body).toEqual({ rollout_id: "verify-1", attempt: 1, reward: 1, answer: "42", continued_from: "return" });
    expect(await resources("/admin/stats")).toMatchObject({ verify_started: 0 });
    expect((await world.backend.calls()).map((c) => c.message_count)).toEqual([2, 4]);

    // Without a crash the parked result is delivered after resume, exactly once.
    await verifyHold(world!.gym.urls.resources!, true);
    let second: any;
    const run2 = world.run("verify-2").then((r) => (second = r.body));
    await world.waitFor(async () => (await resources("/admin/stats")).verify_started === 1, "verify-2 to start");
    const preparing2 = world.client.prepare({ checkpoint_id: "cp-wait-2", deadline_ts: soon(20) });
    await world.waitFor(async () => (await world!.status("environment")).phase !== "idle", "the environment to close admission");
    await verifyHold(world!.gym.urls.resources!, false);
    expect((await preparing2).prepared).toBe(true);
    expect(second).toBeUndefined();
    await world.client.resume({ checkpoint_id: "cp-wait-2" });
    await run2;
    expect(second).toMatchObject({ reward: 1, continued_from: null });
    expect((await world.backend.calls()).filter((c) => c.capture_key === "verify-2")).toHaveLength(2);
  });
});
