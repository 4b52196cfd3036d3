import { Kvm } from "@nats-io/kv";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WatchedMemberRegistry } from "../../coordinator/membership/watched-member-registry.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { startStallProxy, type StallProxy } from "../support/stall-proxy.js";
import { waitUntil } from "../support/wait-until.js";

let nats: NatsFixture;
let proxy: StallProxy;
beforeAll(async () => {
  nats = await startNats();
  proxy = await startStallProxy(Number(new URL(nats.server.url).port));
});
afterAll(async () => {
  await proxy?.close();
  await nats?.close();
});

const announce = (instance: string) => JSON.stringify({ kind: "model", instance, incarnation: "i", started_at: 1, heartbeat_at: 1, protocol_version: 1 });
const announcement = announce("live");

describe("watched membership registry across its own NATS outage", () => {
  it("lists a member that kept beating throughout as soon as the connection is back", { timeout: 30_000 }, async () => {
    // The bucket keeps entries (max_age 60 s): only the registry's own TTL (3 s) is under test.
    const kv = await new Kvm(nats.nc).create("members-reconnect", { history: 1, ttl: 60_000 });
    await kv.put("model.live", announcement);
    const nc: NatsConnection = await connect({ servers: proxy.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const registry = new WatchedMemberRegistry(await new Kvm(nc).open("members-reconnect"), undefined, undefined, 3000);
    const beating = setInterval(() => void kv.put("model.live", announcement).catch(() => undefined), 1000);
    try {
      await registry.start();
      expect((await registry.list()).map((m) => m.instance)).toEqual(["live"]);
      proxy.cut();
      await waitUntil(async () => (await registry.list()).length === 0, "the member aged out of the cut-off view", 10_000);
      const listedAtReconnect = new Promise<string[]>((resolve) => {
        void (async () => {
          for await (const status of nc.status()) if (status.type === "reconnect") return resolve((await registry.list()).map((m) => m.instance));
        })();
      });
      proxy.heal();
      expect(await listedAtReconnect).toEqual(["live"]);
    } finally {
      clearInterval(beating);
      registry.stop();
      await nc.close();
    }
  });

  it("ages a member's last write delivered after the outage from when it was written, not from its delivery", { timeout: 30_000 }, async () => {
    const kv = await new Kvm(nats.nc).create("members-reconnect-replay", { history: 1, ttl: 60_000 });
    const nc: NatsConnection = await connect({ servers: proxy.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const registry = new WatchedMemberRegistry(await new Kvm(nc).open("members-reconnect-replay"), undefined, undefined, 3000);
    const beat = (instance: string) => void kv.put(`model.${instance}`, announce(instance)).catch(() => undefined);
    beat("live");
    beat("dying");
    const live = setInterval(() => beat("live"), 500);
    let dying: NodeJS.Timeout | undefined = setInterval(() => beat("dying"), 500);
    try {
      await registry.start();
      await waitUntil(async () => (await registry.list()).length === 2, "both members listed", 5000);
      proxy.cut();
      await new Promise((resolve) => setTimeout(resolve, 1000));
      // It dies during the coordinator's outage: its last write is what the watch delivers afterwards.
      clearInterval(dying);
      dying = undefined;
      await kv.put("model.dying", announce("dying"));
      const diedAt = Date.now();
      await new Promise((resolve) => setTimeout(resolve, 2500));
      proxy.heal();
      await waitUntil(async () => (await registry.list()).some((m) => m.instance === "live"), "the live member listed again", 5000);
      // Gone 3 s (the TTL) after its last write; 4 s leaves a second for a loaded machine. Taken as
      // seen at its delivery after the outage, it stayed listed until 3 s after the reconnect (5.5 s).
      await new Promise((resolve) => setTimeout(resolve, diedAt + 4000 - Date.now()));
      expect((await registry.list()).map((m) => m.instance)).toEqual(["live"]);
    } finally {
      clearInterval(live);
      if (dying) clearInterval(dying);
      registry.stop();
      await nc.close();
    }
  });
});
