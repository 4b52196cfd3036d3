import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { systemClock } from "../../coordinator/engine/clock.js";
import { KvMemberRegistry } from "../../coordinator/membership/member-registry.js";
import { WatchedMemberRegistry } from "../../coordinator/membership/watched-member-registry.js";
import { startNats, type NatsFixture } from "../support/nats.js";

let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

const member = (instance: string) => JSON.stringify({ kind: "model", instance, incarnation: "i", started_at: 1, heartbeat_at: 1, protocol_version: 1 });

describe("KV membership registry", () => {
  it("lists a member that just heartbeated while the bucket's max_age expires thousands of others", { timeout: 60_000 }, async () => {
    // The listing once ran an ordered consumer (kv.keys()), which entries expiring mid-delivery
    // moved past the live key: about one listing in a hundred left it out.
    // max_age 3 s: the live entry, written just before each listing, must outlast the listing
    // itself (≈ 1,000 gets); at 1 s a listing slowed by a loaded machine saw it expire, rightly.
    const kv = await new Kvm(nats.nc).create("members-expiring", { history: 1, ttl: 3000 });
    const registry = new KvMemberRegistry(kv);
    let listings = 0;
    for (let round = 0; round < 4; round++) {
      await Promise.all(Array.from({ length: 2000 }, (_, k) => kv.put(`model.gone${k}`, member(`gone${k}`))));
      const start = Date.now();
      // Bounded: each round lists until its 2000 entries have expired (max_age 3 s) and a little after.
      while (Date.now() - start < 3500) {
        await kv.put("model.live", member("live"));
        const instances = (await registry.members()).map((m) => m.instance);
        expect(instances).toContain("live");
        listings++;
      }
    }
    expect(listings).toBeGreaterThan(0);
  });
});

describe("watched membership registry seeded at start-up", () => {
  it("ages each seeded entry from its server timestamp: a member silent since before the start expires on its own schedule, not a TTL after the seed; a clock running ahead drops no live member", { timeout: 30_000 }, async () => {
    // The bucket keeps entries (max_age 60 s): only the registry's own TTL (3 s) is under test.
    const kv = await new Kvm(nats.nc).create("members-seeded-age", { history: 1, ttl: 60_000 });
    await kv.put("model.gone", member("gone"));
    const wroteGone = Date.now();
    await new Promise((resolve) => setTimeout(resolve, 2000));
    await kv.put("model.live", member("live")); // a live member's heartbeat
    const ahead = { ...systemClock, now: () => Date.now() + 60_000 };
    const registries = [new WatchedMemberRegistry(kv, undefined, systemClock, 3000), new WatchedMemberRegistry(kv, undefined, ahead, 3000)];
    try {
      for (const registry of registries) await registry.start();
      for (const registry of registries) expect((await registry.list()).map((m) => m.instance)).toEqual(["gone", "live"]);
      // 3.3 s after gone's last write, 1.3 s after the seed: gone has expired, live has not.
      await new Promise((resolve) => setTimeout(resolve, wroteGone + 3300 - Date.now()));
      for (const registry of registries) expect((await registry.list()).map((m) => m.instance)).toEqual(["live"]);
    } finally {
      for (const registry of registries) registry.stop();
    }
  });
});

describe("watched membership registry's incarnationOf", () => {
  it("knows no incarnation of a member whose entry is older than the TTL, though the server still keeps it", { timeout: 30_000 }, async () => {
    // The bucket keeps entries (max_age 60 s): only the registry's own TTL (3 s) is under test, on
    // a monotonic clock this test moves.
    const kv = await new Kvm(nats.nc).create("members-incarnation-ttl", { history: 1, ttl: 60_000 });
    await kv.put("model.silent", member("silent"));
    let monotonic = 1_000_000;
    const registry = new WatchedMemberRegistry(kv, undefined, { ...systemClock, monotonic: () => monotonic }, 3000);
    try {
      await registry.start();
      const ref = { kind: "model" as const, instance: "silent" };
      expect(registry.incarnationOf(ref)).toBe("i");
      monotonic += 3001;
      expect(registry.incarnationOf(ref)).toBeUndefined();
      expect(await registry.list()).toEqual([]);
    } finally {
      registry.stop();
    }
  });
});
