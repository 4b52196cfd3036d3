import { afterEach, describe, expect, it } from "vitest";
import { CONTROLLER_CONNECT_FAILURE } from "../../coordinator/client/nats-controller-client.js";
import { connectNatsWithin } from "../../protocol/nats-first-connect.js";
import { NatsServerProcess } from "../../coordinator/local/nats-server-process.js";
import { CheckpointError } from "../../protocol/index.js";
import { freePortRun } from "../support/ports.js";
import { waitUntil } from "../support/wait-until.js";

/** A first connect (collect, the coordinator daemon, participant programs): a NATS server still starting is waited for, within a bound. */
let server: NatsServerProcess | undefined;
afterEach(async () => {
  await server?.dispose();
  server = undefined;
});

describe("connectNatsWithin", () => {
  it("connects once a server that was not listening yet starts, having said once that it waits", async () => {
    const port = await freePortRun(1);
    const waits: CheckpointError[] = [];
    const connecting = connectNatsWithin({ servers: `nats://127.0.0.1:${port}`, inboxPrefix: "_INBOX_test" }, 20_000, CONTROLLER_CONNECT_FAILURE, { warn: (fields) => void waits.push((fields as { err: CheckpointError }).err) }, 100);
    // The server starts only once a first attempt was refused (nothing listening) and said so.
    await waitUntil(() => waits.length > 0, "the first connect attempt to be refused");
    expect(waits[0]).toMatchObject({ code: "not_leader", message: expect.stringContaining(`cannot reach NATS at nats://127.0.0.1:${port}`) });
    server = await NatsServerProcess.start({ port });
    const nc = await connecting;
    try {
      expect(nc.info?.port).toBe(port);
      expect(waits.map((e) => e.code)).toEqual(["not_leader"]);
    } finally {
      await nc.close();
    }
  });

  it("gives up with not_leader once the bound passes and nothing listens", async () => {
    const port = await freePortRun(1);
    const started = Date.now();
    await expect(connectNatsWithin({ servers: `nats://127.0.0.1:${port}`, inboxPrefix: "_INBOX_test" }, 600, CONTROLLER_CONNECT_FAILURE, undefined, 100)).rejects.toMatchObject({ code: "not_leader" });
    expect(Date.now() - started).toBeGreaterThanOrEqual(400);
    expect(Date.now() - started).toBeLessThan(5_000);
  });
});
