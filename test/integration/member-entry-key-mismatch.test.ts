import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { KvMemberRegistry } from "../../coordinator/membership/member-registry.js";
import { WatchedMemberRegistry } from "../../coordinator/membership/watched-member-registry.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";

let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

const announcement = (instance: string, incarnation: string) => JSON.stringify({ kind: "model", instance, incarnation, started_at: 1, heartbeat_at: 1, protocol_version: 1 });

// Before: an entry under model.a announcing model/b (a value copied by hand, a tool writing the
// wrong key) read as member model/b: listed twice (once per key, with two incarnations), model/a
// silently left out of every checkpoint, and the seed and the watch disagreeing on its key.
describe("a membership entry whose value names another participant than its key", () => {
  it("is unreadable, naming the key's participant, for the bucket read, the seed and the watch alike", { timeout: 20_000 }, async () => {
    const kv = await new Kvm(nats.nc).create("members-key-mismatch", { history: 1, ttl: 60_000 });
    await kv.put("model.b", announcement("b", "i-b"));
    await kv.put("model.a", announcement("b", "i-other"));
    const expectView = (members: { instance: string }[], unreadable: { key: string; participant?: { instance: string } }[]) => {
      expect(members.map((m) => m.instance)).toEqual(["b"]);
      expect(unreadable.map((u) => [u.key, u.participant?.instance])).toEqual([["model.a", "a"]]);
    };
    const direct = new KvMemberRegistry(kv);
    expectView(await direct.list(), await direct.unreadable());

    const watched = new WatchedMemberRegistry(kv, undefined, undefined, 60_000);
    await watched.start();
    try {
      expectView(await watched.list(), await watched.unreadable());
      expect(watched.incarnationOf({ kind: "model", instance: "b" })).toBe("i-b");
      // The same entry delivered by the watch.
      const revision = await kv.put("model.a", announcement("b", "i-other2"));
      await waitUntil(() => (watched as unknown as { lastRevision: number }).lastRevision >= revision, "the watch to deliver the entry", 5000);
      expectView(await watched.list(), await watched.unreadable());
      expect(watched.incarnationOf({ kind: "model", instance: "b" })).toBe("i-b");
    } finally {
      watched.stop();
    }
  });
});
