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
  it("gives up a connection that went silent within about 40 s and reconnects, instead of nats.js's 4 minutes", { timeout: 120_000 }, async () => {
    const nc: NatsConnection = await connect(participantConnectOptions(proxy.url, "environment-server:e1"));
    try {
      const events: string[] = [];
      void (async () => {
        for await (const status of nc.status()) events.push(status.type);
      })();
      await nc.flush();
      const stalledAt = Date.now();
      // What the server host's power loss looks like from here: nothing answers, nothing is refused.
      proxy.stall();
      const bound = stalledAt + 75_000; // about 40 s (three pings 10 s apart unanswered), far from 4 minutes
      while (!events.includes("disconnect") && Date.now() < bound) await new Promise((resolve) => setTimeout(resolve, 250));
      expect(events).toContain("disconnect");
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
