import { StorageType, jetstreamManager } from "@nats-io/jetstream";
import { nanos } from "@nats-io/transport-node";
import { Kvm, type KV } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KvDecisionJournal } from "../../coordinator/ha/decision-journal.js";
import { LeaderLease } from "../../coordinator/ha/leader-lease.js";
import { openBucketAsserted } from "../../coordinator/membership/kv-bucket.js";
import { MEMBERS_BUCKET_OPTIONS, openMembersBucket } from "../../coordinator/membership/members-bucket.js";
import { KvMemberRegistry } from "../../coordinator/membership/member-registry.js";
import { WatchedMemberRegistry } from "../../coordinator/membership/watched-member-registry.js";
import { MEMBER_TTL_MS, leaderBucket, membersBucket } from "../../protocol/index.js";
import { rawRequestWithHeaders } from "../support/raw-nats-request.js";
import { refusalOf } from "../support/refusal.js";
import { NO_HTTP, startWorld, type World } from "./coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";
import { journalEntry } from "../unit/coordinator/fake-participants.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
});
afterAll(async () => {
  await world?.close();
});

describe("membership registry", () => {
  it("opens or creates the bucket with history 1 and bucket TTL, and corrects a differing stream config in place", async () => {
    const kv = await openMembersBucket(world.pnc, world.deployment);
    const status = await kv.status();
    expect(MEMBERS_BUCKET_OPTIONS).toEqual({ history: 1, ttl: MEMBER_TTL_MS });
    expect(status.history).toBe(1);
    expect(status.ttl).toBe(MEMBER_TTL_MS);
    // A bucket created with another lifetime (e.g. the leader bucket after lease_ms changed) is
    // updated in place, keeping its sequence: a recreated leader bucket would restart the epochs.
    const other = await new Kvm(world.pnc).create("gym_ckpt_wrongttl_members", { history: 1, ttl: 60_000 });
    for (let i = 0; i < 3; i++) await other.put("k", String(i));
    const corrected = await openBucketAsserted(world.pnc, "gym_ckpt_wrongttl_members", MEMBERS_BUCKET_OPTIONS);
    expect((await corrected.status()).ttl).toBe(MEMBER_TTL_MS);
    expect(await corrected.put("k", "next")).toBe(4); // the revision keeps counting
    expect(membersBucket(world.deployment)).toBe(`gym_ckpt_${world.deployment}_members`);
  });

  it("refuses a bucket kept in memory (a NATS restart would lose the journal and restart the leader epochs), naming the bucket; the coordinator does not start", async () => {
    await new Kvm(world.pnc).create("gym_ckpt_inmemory_journal", { history: 1, storage: StorageType.Memory });
    const refused = await refusalOf(openBucketAsserted(world.pnc, "gym_ckpt_inmemory_journal", { history: 1, ttl: 0 }));
    expect(refused.code).toBe("invalid_request");
    expect(refused.message).toMatch(/gym_ckpt_inmemory_journal.*memory/);
    await new Kvm(world.pnc).create(leaderBucket(world.deployment), { history: 1, ttl: 500, storage: StorageType.Memory });
    expect((await refusalOf(world.startCoordinator())).code).toBe("invalid_request");
  });

  it("the leader bucket's lease is not shortened in place while a coordinator leads with it (a shorter lease_ms is refused, naming both); raised in place, and lowered once nobody leads", async () => {
    const deployment = "lease-lower";
    const lease = (id: string, leaseMs: number) => new LeaderLease({ nc: world.pnc, deployment, id, leaseMs });
    const ttl = async () => (await (await new Kvm(world.pnc).open(leaderBucket(deployment))).status()).ttl;
    const leader = lease("a", 3_000);
    await leader.start();
    expect(leader.state().leader).toBe(true);
    const shorter = await refusalOf(lease("b", 1_000).start());
    expect(shorter.code).toBe("invalid_request");
    expect(shorter.message).toMatch(/is 3000 ms and a coordinator leads with it.*lease_ms 1000/);
    expect(await ttl()).toBe(3_000);
    expect(leader.state().leader).toBe(true);
    const longer = lease("c", 6_000);
    await longer.start(); // raising is safe: the leader renews more often than it must
    expect(await ttl()).toBe(6_000);
    await longer.stop();
    await leader.stop(); // releases the key
    const lowered = lease("d", 1_000);
    await lowered.start();
    expect(await ttl()).toBe(1_000);
    await lowered.stop();
  });

  it("a shorter lease_ms is refused under a live leader although a lagging replica (an R3 bucket's direct get may be answered by one) shows no key", async () => {
    const deployment = "lease-lag";
    const leader = new LeaderLease({ nc: world.pnc, deployment, id: "a", leaseMs: 3_000 });
    await leader.start();
    // Every direct get of the next coordinator's bucket handle is answered as by a replica without the key.
    const asLaggingReplica = (kv: KV) => void ((kv as unknown as { jsm: { direct: { getMessage: () => Promise<null> } } }).jsm.direct.getMessage = async () => null);
    try {
      expect((await refusalOf(new LeaderLease({ nc: world.pnc, deployment, id: "b", leaseMs: 1_000, hooks: { beforeLeaderCheck: asLaggingReplica } }).start())).code).toBe("invalid_request");
    } finally {
      await leader.stop();
    }
  });

  it("a coordinator winning the lease between a shorter lease_ms's 'nobody leads' check and its update keeps the longer lease: the shortening is refused and undone", async () => {
    const deployment = "lease-lower-race";
    const ttl = async () => (await (await new Kvm(world.pnc).open(leaderBucket(deployment))).status()).ttl;
    await new Kvm(world.pnc).create(leaderBucket(deployment), { history: 1, ttl: 3_000 });
    const winner = new LeaderLease({ nc: world.pnc, deployment, id: "a", leaseMs: 3_000 });
    // The winner campaigns right after b found nobody leading, before b's update: it passes its own
    // check of the bucket's lease (still 3000 ms), and would then run under b's 1000 ms.
    let checks = 0;
    const winAfterFirstCheck = async () => {
      if (checks++ === 0) await winner.start();
    };
    try {
      const shorter = await refusalOf(new LeaderLease({ nc: world.pnc, deployment, id: "b", leaseMs: 1_000, hooks: { afterNoLeaderFound: winAfterFirstCheck } }).start());
      expect(shorter.message).toMatch(/is 3000 ms and a coordinator leads with it.*lease_ms 1000/);
      expect(winner.state().leader).toBe(true);
      // Before: b started, and the winner's key expired 1000 ms after each renewal, sent every 1000 ms.
      expect(await ttl()).toBe(3_000);
    } finally {
      await winner.stop();
    }
  });

  it("a renewal whose answer is lost but which landed is read back from the server and kept: the leader neither demotes nor leaves its key behind", async () => {
    const deployment = "lease-landed";
    const kv = await openBucketAsserted(world.pnc, leaderBucket(deployment), { history: 1, ttl: 1_500 });
    const update = kv.update.bind(kv);
    let lost = 0;
    kv.update = async (...args: Parameters<typeof kv.update>) => {
      const landed = await update(...args);
      if (lost++ === 0) throw new Error("TimeoutError: timeout");
      return landed;
    };
    const events: string[] = [];
    const lease = new LeaderLease({ nc: world.pnc, deployment, id: "a", leaseMs: 1_500, kv, onLost: (epoch) => void events.push(`lost:${epoch}`) });
    await lease.start();
    const epoch = lease.state().epoch;
    await waitUntil(() => lost >= 3, "two renewals after the lost answer", 5_000);
    expect(events).toEqual([]);
    expect(lease.state()).toMatchObject({ leader: true, epoch });
    await lease.stop();
    expect(await kv.get("coordinator")).toMatchObject({ operation: "DEL" });
  });

  it("a coordinator following with a longer lease_ms than the bucket's (lowered while nobody led) does not lead under it", async () => {
    const deployment = "lease-longer";
    const leader = new LeaderLease({ nc: world.pnc, deployment, id: "x", leaseMs: 3_000 });
    await leader.start();
    const follower = new LeaderLease({ nc: world.pnc, deployment, id: "c", leaseMs: 3_000 });
    await follower.start();
    expect(follower.state().leader).toBe(false);
    // What a coordinator started with lease_ms 1000 does to the bucket when nobody leads.
    const jsm = await jetstreamManager(world.pnc);
    await jsm.streams.update(`KV_${leaderBucket(deployment)}`, { max_age: nanos(1_000), duplicate_window: nanos(1_000) });
    await leader.stop();
    try {
      // Before: it led, acting for 3 s after each renewal while its key expired after 1 s.
      expect(await follower.campaignNow()).toBe(false);
      expect(await (await new Kvm(world.pnc).open(leaderBucket(deployment))).get("coordinator")).not.toMatchObject({ operation: "PUT" });
    } finally {
      await follower.stop();
    }
  });

  it("a won revision not above the highest published epoch (the leader bucket recreated) is moved past it", async () => {
    const deployment = "lease-floor";
    const first = new LeaderLease({ nc: world.pnc, deployment, id: "a", leaseMs: 1_000, epochFloor: () => 40 });
    await first.start();
    expect(first.state()).toMatchObject({ leader: true, epoch: 41 });
    await first.stop();
    // Above the floor already: taken as it comes.
    const second = new LeaderLease({ nc: world.pnc, deployment, id: "b", leaseMs: 1_000, epochFloor: () => 40 });
    await second.start();
    expect(second.state()).toMatchObject({ leader: true, epoch: 43 }); // 42: the first one's delete
    await second.stop();
    // A floor past 2^53 (a hand-edited checkpoint.json) cannot be honoured: ignored, not a leaderless deployment.
    const third = new LeaderLease({ nc: world.pnc, deployment, id: "c", leaseMs: 1_000, epochFloor: () => 2 ** 60 });
    await third.start();
    expect(third.state()).toMatchObject({ leader: true, epoch: 45 });
    await third.stop();
  });

  it("a coordinator started after the leader bucket was recreated leads above the epochs published: participants accept it, retention keeps the newest", async () => {
    const w = await startWorld({ nats: world.nats });
    try {
      await w.startParticipants();
      const first = await w.startCoordinator(NO_HTTP);
      await first.whenReady();
      await w.client.checkpoint({ checkpoint_id: "floor-1" });
      const before = await w.client.checkpoint({ checkpoint_id: "floor-2" });
      await first.stop();
      // Deleted, as docs/api.md says to for a leader bucket in memory storage; the next start recreates it.
      await (await jetstreamManager(w.pnc)).streams.delete(`KV_${leaderBucket(w.deployment)}`);
      // Restarted participants have seen no epoch: only the published ones can lift the new term.
      await w.stopParticipants();
      await w.startParticipants();
      const second = await w.startCoordinator(NO_HTTP);
      await second.whenReady();
      const after = await w.client.checkpoint({ checkpoint_id: "floor-3" });
      expect(after.epoch).toBeGreaterThan(before.epoch);
      expect((await w.client.checkpoint({ checkpoint_id: "floor-4" })).deleted).toEqual(["floor-2"]);
    } finally {
      await w.close();
    }
  });

  it("after the leader bucket was recreated, a coordinator leads above an epoch participants saw but no checkpoint published", async () => {
    const w = await startWorld({ nats: world.nats });
    try {
      await w.startParticipants();
      const first = await w.startCoordinator(NO_HTTP);
      await first.whenReady();
      const published = await w.client.checkpoint({ checkpoint_id: "seen-1" });
      await first.stop();
      // A later term that publishes nothing: every participant sees its epoch (prepare, then resume).
      const second = await w.startCoordinator(NO_HTTP);
      await second.whenReady();
      const unpublished = second.lease.state().epoch!;
      expect(unpublished).toBeGreaterThan(published.epoch + 1);
      expect((await w.client.prepare({ checkpoint_id: "seen-2" })).prepared).toBe(true);
      await w.client.resume({ checkpoint_id: "seen-2" });
      await second.stop();
      await (await jetstreamManager(w.pnc)).streams.delete(`KV_${leaderBucket(w.deployment)}`);
      const third = await w.startCoordinator(NO_HTTP);
      await third.whenReady();
      // Before: the published floor alone put this term at published.epoch + 1, below what the
      // participants had seen, and every one of them refused it (stale_epoch) until restarted.
      expect(third.lease.state().epoch).toBeGreaterThan(unpublished);
      const after = await w.client.checkpoint({ checkpoint_id: "seen-3" });
      expect(after.epoch).toBe(third.lease.state().epoch);
    } finally {
      await w.close();
    }
  });

  it("after the leader bucket was recreated, a coordinator leads above an epoch only its decision journal holds (no checkpoint published it, no participant that answers reports it)", async () => {
    const w = await startWorld({ nats: world.nats });
    try {
      // A predecessor's decision at epoch 500, left in the journal; the leader bucket is new (revisions from 1).
      const journal = await KvDecisionJournal.open(w.pnc, w.deployment);
      await journal.record(journalEntry({ checkpoint_id: "journaled-500", epoch: 500, state: "open", participants: [] }));
      const coordinator = await w.startCoordinator(NO_HTTP);
      await coordinator.whenReady();
      // Before: epoch 1, and recovery re-drove the entry to its participants under an epoch below the one they saw.
      expect(coordinator.lease.state().epoch).toBeGreaterThan(500);
      expect(await journal.list()).toEqual([]); // recovered (resumed) as before
    } finally {
      await w.close();
    }
  });

  it("sees participants join and leave through the KV watch", async () => {
    const registry = new WatchedMemberRegistry(await openMembersBucket(world.pnc, world.deployment));
    await registry.start();
    try {
      expect(await registry.list()).toEqual([]);
      const [env] = await world.startParticipants([{ kind: "environment", instance: "e9" }]);
      await waitUntil(async () => (await registry.list()).length === 1, "one registered member", 5000);
      expect(await registry.list()).toEqual([{ kind: "environment", instance: "e9" }]);
      await env!.handle.stop();
      world.participants.length = 0;
      await waitUntil(async () => (await registry.list()).length === 0, "no registered member", 5000);
    } finally {
      registry.stop();
    }
  });

  it("seeds its members from the stream's leader: a member a lagging replica (answering the direct gets) lacks is listed at once", async () => {
    const kv = await openMembersBucket(world.pnc, world.deployment);
    await kv.put("agent.seeded", JSON.stringify({ kind: "agent", instance: "seeded", incarnation: "i", started_at: 1, heartbeat_at: 1, protocol_version: 1 }));
    const lagging = await openMembersBucket(world.pnc, world.deployment);
    (lagging as unknown as { jsm: { direct: { getMessage: () => Promise<null> } } }).jsm.direct.getMessage = async () => null;
    const registry = new WatchedMemberRegistry(lagging);
    await registry.start();
    try {
      expect(await registry.list()).toEqual([{ kind: "agent", instance: "seeded" }]);
    } finally {
      registry.stop();
      await kv.delete("agent.seeded");
    }
  });

  it("a member removed while the seed reads the bucket stays removed: the seed's older copy does not list it again for a TTL", async () => {
    const kv = await openMembersBucket(world.pnc, world.deployment);
    await kv.put("agent.leaving", JSON.stringify({ kind: "agent", instance: "leaving", incarnation: "i", started_at: 1, heartbeat_at: 1, protocol_version: 1 }));
    const registry = new WatchedMemberRegistry(kv);
    const applied = () => (registry as unknown as { lastRevision: number }).lastRevision;
    const get = kv.get.bind(kv);
    let removed = false;
    // The participant stops (deletes its entry) right after the seed read it, and the watch delivers that removal first.
    kv.get = async (key, options) => {
      const entry = await get(key, options);
      if (key === "agent.leaving" && !removed) {
        removed = true;
        await kv.delete(key);
        const marker = (await get(key))!.revision;
        await waitUntil(() => applied() >= marker, "the watch to deliver the removal", 5000);
      }
      return entry;
    };
    await registry.start();
    try {
      expect(removed).toBe(true);
      expect((await registry.list()).filter((m) => m.instance === "leaving")).toEqual([]);
    } finally {
      registry.stop();
    }
  });

  it("keeps following the bucket when its KV watch ends under it (nats.js gives up re-creating the ordered consumer): an entry written after the end, and a removal, are still seen", async () => {
    const kv = await openMembersBucket(world.pnc, world.deployment);
    const watches: { stop(): void }[] = [];
    // The bucket itself, but every watch it opens is kept here, so the test can end it as nats.js does.
    const watched = Object.create(kv, {
      watch: {
        value: async (...args: Parameters<typeof kv.watch>) => {
          const watch = await kv.watch(...args);
          watches.push(watch);
          return watch;
        },
      },
    }) as typeof kv;
    const registry = new WatchedMemberRegistry(watched);
    await registry.start();
    const member = (instance: string) => JSON.stringify({ kind: "model", instance, incarnation: "i", started_at: 1, heartbeat_at: 1, protocol_version: 1 });
    try {
      await kv.put("model.before", member("before"));
      await waitUntil(async () => (await registry.list()).length === 1, "the member written before the end", 5000);
      // What the ordered consumer does after 30 failed re-creations, or when its subscription closes.
      watches[0]!.stop();
      await waitUntil(() => watches.length === 2, "a new watch", 5000);
      await kv.put("model.after", member("after"));
      await kv.delete("model.before");
      await waitUntil(async () => JSON.stringify(await registry.list()) === JSON.stringify([{ kind: "model", instance: "after" }]), "the entry written after the end, without the removed one", 5000);
    } finally {
      registry.stop();
      await kv.delete("model.after");
    }
  });

  it("lists and follows the valid members past an entry whose header block nats.js cannot decode, or whose key is no KV key (any client may publish them)", async () => {
    const deployment = "badentries";
    const kv = await openMembersBucket(world.pnc, deployment);
    const bucket = membersBucket(deployment);
    const member = (instance: string) => JSON.stringify({ kind: "model", instance, incarnation: "i", started_at: 1, heartbeat_at: 1, protocol_version: 1 });
    await kv.put("model.m1", member("m1"));
    await rawRequestWithHeaders(world.nats.server.url, `$KV.${bucket}.model.bad`, "NATS/1.0\r\nbad name: x\r\n\r\n", member("bad"));
    await world.pnc.request(`$KV.${bucket}.model.b@d`, member("b@d"));
    expect(await new KvMemberRegistry(kv).list()).toEqual([{ kind: "model", instance: "m1" }]);
    const registry = new WatchedMemberRegistry(kv);
    await registry.start();
    try {
      expect(await registry.list()).toEqual([{ kind: "model", instance: "m1" }]);
      // The same arriving through the watch, then a valid entry after them.
      await rawRequestWithHeaders(world.nats.server.url, `$KV.${bucket}.model.bad`, "NATS/1.0\r\nbad name: x\r\n\r\n", member("bad"));
      await kv.put("model.m2", member("m2"));
      await waitUntil(async () => (await registry.list()).length === 2, "the entry written after the unreadable one", 5000);
      expect(await registry.list()).toEqual([{ kind: "model", instance: "m1" }, { kind: "model", instance: "m2" }]);
    } finally {
      registry.stop();
    }
  });

  it("drops a member whose heartbeat stopped for longer than the bucket TTL", async () => {
    const kv = await openMembersBucket(world.pnc, world.deployment);
    let now = 1_000_000;
    const clock = { now: () => now, monotonic: () => now, setTimer: () => () => undefined, sleep: async () => undefined };
    const registry = new WatchedMemberRegistry(kv, undefined, clock);
    await registry.start();
    try {
      await kv.put("model.silent", JSON.stringify({ kind: "model", instance: "silent", incarnation: "i", started_at: 1, heartbeat_at: 1, protocol_version: 1 }));
      await waitUntil(async () => (await registry.list()).length === 1, "one registered member", 5000);
      now += MEMBER_TTL_MS + 1;
      expect(await registry.list()).toEqual([]);
    } finally {
      registry.stop();
      await kv.delete("model.silent");
    }
  });

  it("ages entries on the monotonic clock: a wall-clock step neither drops live members nor keeps a silent one", async () => {
    const kv = await openMembersBucket(world.pnc, world.deployment);
    let wall = 1_000_000;
    let mono = 0;
    const clock = { now: () => wall, monotonic: () => mono, setTimer: () => () => undefined, sleep: async () => undefined };
    const registry = new WatchedMemberRegistry(kv, undefined, clock);
    await registry.start();
    try {
      await kv.put("model.stepped", JSON.stringify({ kind: "model", instance: "stepped", incarnation: "i", started_at: 1, heartbeat_at: 1, protocol_version: 1 }));
      await waitUntil(async () => (await registry.list()).length === 1, "one registered member", 5000);
      // NTP or a VM resume moves the wall clock a minute ahead: the member heartbeated a moment ago.
      wall += 60_000;
      expect(await registry.list()).toEqual([{ kind: "model", instance: "stepped" }]);
      // ... and back: a member silent for longer than the TTL is gone all the same.
      wall -= 120_000;
      mono += MEMBER_TTL_MS + 1;
      expect(await registry.list()).toEqual([]);
    } finally {
      registry.stop();
      await kv.delete("model.stepped");
    }
  });
});
