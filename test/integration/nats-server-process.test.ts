import { afterEach, describe, expect, it } from "vitest";
import { connect } from "@nats-io/transport-node";
import { jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { NatsServerProcess } from "../support/nats.js";

describe("NatsServerProcess", () => {
  let server: NatsServerProcess | undefined;
  afterEach(async () => {
    await server?.dispose();
    server = undefined;
  });

  it("starts on a free loopback port with JetStream", async () => {
    server = await NatsServerProcess.start();
    expect(server.port).toBeGreaterThan(0);
    const nc = await connect({ servers: server.url });
    const jsm = await jetstreamManager(nc);
    const info = await jsm.getAccountInfo();
    expect(info.limits).toBeDefined();
    await nc.close();
  });

  it("keeps KV data across kill -9 and restart on the same store and port", async () => {
    server = await NatsServerProcess.start();
    const port = server.port;
    let nc = await connect({ servers: server.url });
    const kv = await new Kvm(nc).create("launcher_test");
    await kv.put("k", "v1");
    await nc.close();

    await server.kill();
    await server.restart();
    expect(server.port).toBe(port);

    nc = await connect({ servers: server.url });
    const again = await new Kvm(nc).open("launcher_test");
    expect((await again.get("k"))?.string()).toBe("v1");
    await nc.close();
  });
});
