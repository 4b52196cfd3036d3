import { jetstreamManager } from "@nats-io/jetstream";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { systemClock } from "../../coordinator/engine/clock.js";
import { openMembersBucket } from "../../coordinator/membership/members-bucket.js";
import { WatchedMemberRegistry } from "../../coordinator/membership/watched-member-registry.js";
import { MembershipAnnouncer } from "../../participants/control-plane/membership-announcer.js";
import { membersBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";

// The membership bucket deleted and created again under a running coordinator (NATS back without
// its JetStream store, an operator's `nats kv rm`): the participants write their entries again
// (the announcer re-creates the bucket), and the coordinator's view must show them. The KV watch's
// ordered consumer resumes after the last stream sequence it delivered, which the new stream only
// reaches after as many writes: until then the watch delivers nothing and every member ages out.
let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

describe("watched membership registry, bucket re-created", () => {
  it("lists a member that announces again in a re-created bucket, after the old bucket's entries aged out", { timeout: 30_000 }, async () => {
    const deployment = "recreated";
    const kv = await openMembersBucket(nats.nc, deployment);
    // A bucket that has been in use: its sequence is well past what the new one reaches in the test.
    for (let i = 0; i < 300; i++) await kv.put("model.filler", "x");
    await kv.delete("model.filler");
    // The registry's own TTL 2 s (the bucket's stays 15 s), so its view ages out quickly.
    // Its clock can be moved on past that TTL at once, instead of the test waiting it out.
    let skipped = 0;
    const clock = { ...systemClock, monotonic: () => systemClock.monotonic() + skipped };
    const registry = new WatchedMemberRegistry(kv, undefined, clock, 2_000, 300);
    await registry.start();
    const announcer = new MembershipAnnouncer(await nats.connect(), deployment, "agent", "a1", "inc-1", undefined, 200);
    await announcer.claim();
    await announcer.start();
    try {
      await waitUntil(async () => (await registry.list()).length === 1, "the member listed", 5_000);
      await (await jetstreamManager(nats.nc)).streams.delete(`KV_${membersBucket(deployment)}`);
      // The announcer creates the bucket again and re-announces within a few beats.
      await waitUntil(async () => (await (await openMembersBucket(nats.nc, deployment)).get("agent.a1"))?.operation === "PUT", "the entry written again", 5_000);
      // Past the registry's TTL: only what it learns from the new bucket can list the member now.
      skipped += 2_500;
      await waitUntil(async () => (await registry.list()).length === 1, "the member listed from the re-created bucket", 5_000);
      expect(await registry.list()).toEqual([{ kind: "agent", instance: "a1" }]);
      expect(registry.incarnationOf({ kind: "agent", instance: "a1" })).toBe("inc-1");
    } finally {
      registry.stop();
      await announcer.stop();
    }
  });

  it("takes an entry of the re-created bucket over one the view kept from the old bucket, whatever their revisions", { timeout: 30_000 }, async () => {
    const deployment = "recreated-revisions";
    const kv = await openMembersBucket(nats.nc, deployment);
    const announce = (incarnation: string) => JSON.stringify({ kind: "agent", instance: "a1", incarnation, started_at: 1, heartbeat_at: 1, protocol_version: 1 });
    // The old bucket's entry at a revision far past what the new bucket reaches in the test.
    for (let i = 0; i < 300; i++) await kv.put("agent.filler", "x");
    await kv.put("agent.a1", announce("old"));
    // A TTL the test does not reach: the entry kept from the old bucket stays in the view.
    const internals = (registry: WatchedMemberRegistry) => registry as unknown as { generation: number; fromOldBucket: Set<string> };
    const registry = new WatchedMemberRegistry(kv, undefined, systemClock, 60_000, 300);
    await registry.start();
    try {
      expect(registry.incarnationOf({ kind: "agent", instance: "a1" })).toBe("old");
      await (await jetstreamManager(nats.nc)).streams.delete(`KV_${membersBucket(deployment)}`);
      const fresh = await openMembersBucket(nats.nc, deployment);
      // Found re-created and read again before the participant announces there.
      await waitUntil(() => internals(registry).generation === 1 && internals(registry).fromOldBucket.size === 0, "the re-created bucket found and read", 5_000);
      await fresh.put("agent.a1", announce("new"));
      await waitUntil(() => registry.incarnationOf({ kind: "agent", instance: "a1" }) === "new", "the new bucket's entry in the view", 5_000);
    } finally {
      registry.stop();
    }
  });
});
