import { connect, type NatsConnection } from "@nats-io/transport-node";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { participantConnectOptions } from "../../participants/gym/server-runtime.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { startStallProxy, type StallProxy } from "../support/stall-proxy.js";

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

describe("a participant program's NATS connection", () => {
  // The production pings (10 s apart, 3 unanswered) give a silent connection up within about 40 s, far
  // from nats.js's 4 minutes. The stall below runs them ten times faster: the same options, the
  // interval a tenth, so the test proves the mechanism in about 4 s rather than waiting 40.
  it("gives up a connection that went silent after its unanswered pings and reconnects (production: about 40 s, instead of nats.js's 4 minutes)", { timeout: 60_000 }, async () => {
    const production = participantConnectOptions(proxy.url, "environment-server:e1");
    expect({ pingInterval: production.pingInterval, maxPingOut: production.maxPingOut }).toEqual({ pingInterval: 10_000, maxPingOut: 3 });
    const nc: NatsConnection = await connect({ ...production, pingInterval: production.pingInterval! / 10 });
    try {
      const events: string[] = [];
      void (async () => {
        for await (const status of nc.status()) events.push(status.type);
      })();
      await nc.flush();
      const stalledAt = Date.now();
      // What the server host's power loss looks like from here: nothing answers, nothing is refused.
      proxy.stall();
      const bound = stalledAt + 7_500; // about 4 s (three pings 1 s apart unanswered), far from 24 s (4 minutes / 10)
      while (!events.includes("disconnect") && Date.now() < bound) await new Promise((resolve) => setTimeout(resolve, 50));
      expect(events).toContain("disconnect");
      expect(Date.now() - stalledAt).toBeGreaterThanOrEqual(2_000); // not given up before its pings went unanswered
      proxy.heal();
      const until = Date.now() + 20_000;
      while (!events.includes("reconnect") && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 100));
      expect(events).toContain("reconnect");
      await nc.flush();
    } finally {
      await nc.close();
    }
  });
});
