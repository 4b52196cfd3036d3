import { jetstreamManager, StorageType, type JetStreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { nanos } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { systemClock } from "../../coordinator/engine/clock.js";
import { openMembersBucket } from "../../coordinator/membership/members-bucket.js";
import { WatchedMemberRegistry } from "../../coordinator/membership/watched-member-registry.js";
import { CheckpointError, MEMBER_TTL_MS, membersBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";

// The coordinator asserts the members bucket's config at its start (openBucketAsserted). A bucket
// deleted and re-created by hand under a running coordinator (`nats kv rm` then `nats kv add` with
// another TTL, or in memory) was never checked again: the registry followed it as it was.
let nats: NatsFixture;
let jsm: JetStreamManager;
beforeAll(async () => {
  nats = await startNats();
  jsm = await jetstreamManager(nats.nc);
});
afterAll(async () => {
  await nats?.close();
});

const announcement = JSON.stringify({ kind: "agent", instance: "a1", incarnation: "i", started_at: 1, heartbeat_at: 1, protocol_version: 1 });

/** A registry as the coordinator's daemon makes it, its stream checked every 300 ms; an entry already delivered. */
async function runningRegistry(deployment: string): Promise<WatchedMemberRegistry> {
  const kv = await openMembersBucket(nats.nc, deployment);
  const registry = new WatchedMemberRegistry(kv, undefined, systemClock, MEMBER_TTL_MS, 300, () => openMembersBucket(nats.nc, deployment));
  await registry.start();
  // Delivered by the watch: re-opened after the deletion, it resumes from a revision (no read of the bucket in between).
  await kv.put("agent.a1", announcement);
  await waitUntil(async () => (await registry.list()).length === 1, "the member listed", 5_000);
  return registry;
}

describe("watched membership registry, bucket re-created by hand", () => {
  it("refuses listings, invalid_request as the start would, when it is re-created in memory storage", { timeout: 30_000 }, async () => {
    const deployment = "recreated-memory";
    const registry = await runningRegistry(deployment);
    try {
      const bucket = membersBucket(deployment);
      await jsm.streams.delete(`KV_${bucket}`);
      await jsm.streams.add({
        name: `KV_${bucket}`,
        subjects: [`$KV.${bucket}.>`],
        max_msgs_per_subject: 1,
        max_age: nanos(MEMBER_TTL_MS),
        storage: StorageType.Memory,
        allow_rollup_hdrs: true,
      });
      let refusal: unknown;
      await waitUntil(async () => (refusal = await registry.list().then(() => undefined, (error: unknown) => error)) !== undefined, "a listing refused", 10_000);
      expect(refusal).toBeInstanceOf(CheckpointError);
      expect((refusal as CheckpointError).code).toBe("invalid_request");
      expect((refusal as CheckpointError).message).toMatch(/memory storage/);
    } finally {
      registry.stop();
    }
  });

  it("has the bucket's TTL put back in place when it is re-created with another one", { timeout: 30_000 }, async () => {
    const deployment = "recreated-ttl";
    const registry = await runningRegistry(deployment);
    try {
      const bucket = membersBucket(deployment);
      await jsm.streams.delete(`KV_${bucket}`);
      const handMade = await new Kvm(nats.nc).create(bucket, { history: 1, ttl: 60_000 });
      await waitUntil(async () => (await handMade.status()).ttl === MEMBER_TTL_MS, "the TTL put back", 10_000);
      await handMade.put("agent.a1", announcement);
      await waitUntil(async () => (await registry.list()).length === 1, "the member listed from the re-created bucket", 5_000);
    } finally {
      registry.stop();
    }
  });
});
