import { existsSync } from "node:fs";
import { rm } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { verifyCheckpoint } from "../../coordinator/publication/verify-checkpoint.js";
import { startWorld, type World } from "./coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";

// Real participants refuse a commit whose checkpoint directory they do not see (storage_error); the
// coordinator makes again the one removed between prepare and commit, so the commit goes through.
let world: World;
beforeAll(async () => {
  world = await startWorld();
  await world.startParticipants();
  await (await world.startCoordinator()).whenReady();
});
afterAll(async () => {
  await world?.close();
});

describe("the checkpoint directory removed between prepare and commit, over a real nats-server", () => {
  it("is made again before the commits: every participant commits into it and the checkpoint publishes", async () => {
    const dir = join(world.root, "gone-1");
    await world.client.prepare({ checkpoint_id: "gone-1" });
    await waitUntil(() => existsSync(dir), "the staged checkpoint directory", 5000);
    await rm(dir, { recursive: true }); // an operator's cleanup, say
    const commit = await world.client.commit({ checkpoint_id: "gone-1" });
    expect(commit.participants.length).toBe(world.participants.length);
    for (const p of commit.participants) expect(existsSync(join(dir, p.manifest_path))).toBe(true);
    await world.client.publish({ checkpoint_id: "gone-1" });
    await world.client.resume({ checkpoint_id: "gone-1" });
    const catalog = new CheckpointCatalog(world.root);
    expect(await catalog.latest()).toBe("gone-1");
    expect((await verifyCheckpoint(catalog, "gone-1")).participants.length).toBe(world.participants.length);
  });
});
