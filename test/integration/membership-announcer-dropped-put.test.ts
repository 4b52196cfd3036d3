import { Kvm, type KvEntry } from "@nats-io/kv";
import { connect, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { MembershipAnnouncer } from "../../participants/control-plane/membership-announcer.js";
import { memberKey, membersBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { startStallProxy, type StallProxy } from "../support/stall-proxy.js";
import { waitUntil } from "../support/wait-until.js";

// A heartbeat put lost on its way to nats-server goes unanswered: nats.js gives up on it only after
// its request timeout. Before, the beat waited for that (5 s) and skipped every tick meanwhile, so
// one lost put left the entry unrefreshed for 5 s and more (with the default 5 s period, the whole
// 15 s TTL: the coordinator dropped a live participant). Now it costs that one beat.
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

const PERIOD_MS = 500;

describe("a participant whose heartbeat put is lost on the way to NATS", () => {
  it("keeps its registry entry: the next beat lands a period later, not after nats.js' timeout", { timeout: 30_000 }, async () => {
    const deployment = "anndrop";
    const key = memberKey("environment", "env0");
    const nc: NatsConnection = await connect({ servers: proxy.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    const announcer = new MembershipAnnouncer(nc, deployment, "environment", "env0", "inc-drop", undefined, PERIOD_MS);
    await announcer.claim();
    await announcer.start();
    // Every write that lands, as nats-server stamps it, seen by a watcher on a connection of its own.
    const landed: KvEntry[] = [];
    const watch = await (await new Kvm(nats.nc).open(membersBucket(deployment))).watch({ key });
    void (async () => {
      for await (const entry of watch) landed.push(entry);
    })();
    try {
      await waitUntil(() => landed.length >= 3, "the heartbeat's cadence");
      await proxy.dropNextPublish(`$KV.${membersBucket(deployment)}.${key}`);
      const droppedAt = landed.length;
      await waitUntil(() => landed.length >= droppedAt + 4, "beats after the lost put");
      expect(landed.map((entry) => entry.operation)).not.toContain("DEL");
      expect(landed.every((entry) => entry.operation === "PUT" && entry.json<{ incarnation: string }>().incarnation === "inc-drop")).toBe(true);
      const times = landed.map((entry) => entry.created.getTime());
      const gaps = times.slice(1).map((at, i) => at - times[i]!);
      // One beat lost, its successor on the next tick: two periods, plus scheduling slack (before: over 5 s).
      expect(Math.max(...gaps)).toBeLessThanOrEqual(2.5 * PERIOD_MS);
    } finally {
      watch.stop();
      await announcer.stop();
      await nc.close();
    }
  });
});
