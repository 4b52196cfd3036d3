import { randomUUID } from "node:crypto";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { GlobalManifestSchema, captureKey } from "../../protocol/index.js";
import { NO_HTTP, startWorld, type World } from "./coordinator-harness.js";

/**
 * A participant exporting tens of thousands of episodes (a null-scope commit: "everything it
 * holds") lists more capture keys than one control message holds. Its commit reply leaves the
 * list out (count and digest instead) and the coordinator reads it from the committed records:
 * the checkpoint publishes, and checkpoint.json lists every episode.
 */
let world: World;
beforeAll(async () => {
  world = await startWorld();
});
afterAll(async () => {
  await world?.close();
});

describe("commit of more episodes than one reply can list", () => {
  it("30,000 UUID rollouts at one participant, null scope: published, checkpoint.json lists them all", async () => {
    const [env] = await world.startParticipants([
      { kind: "environment", instance: "env1" },
      { kind: "agent", instance: "agent1" },
    ]);
    // UUID-length ids, never ending -a<digits> (an attempt suffix, which rollout ids may not)
    const episodes = Array.from({ length: 30_000 }, () => ({ rollout_id: `${randomUUID()}-r`, attempt: 0 }));
    for (const episode of episodes) env!.adapter.addEpisode(episode, null);
    // Reading 30,000 ids back and publishing them keeps the event loop busy for a while: on a loaded
    // machine the harness's 500 ms lease lapsed meanwhile (leadership lost mid-checkpoint).
    const coordinator = await world.startCoordinator({ ...NO_HTTP, default_timeout_ms: 30_000, lease_ms: 3000 });
    await coordinator.whenReady();
    const reply = await world.client.checkpoint({ checkpoint_id: "many" });
    expect(reply).toMatchObject({ checkpoint_id: "many", participants: 2, resume_failures: [] });
    const manifest = GlobalManifestSchema.parse(JSON.parse(await readFile(join(world.root, "many", "checkpoint.json"), "utf8")));
    const listed = manifest.participants.find((p) => p.kind === "environment")!.episode_ids;
    expect(listed).toEqual(episodes.map(captureKey).sort());
    await expect(world.client.get("many")).resolves.toMatchObject({ manifest: { checkpoint_id: "many" } });
  }, 120_000);
});
