import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PACKAGE_VERSION, PROTOCOL_VERSION } from "../../protocol/index.js";
import { startCoordinator } from "../../coordinator/daemon/coordinator-daemon.js";
import { startWorld, type World } from "./coordinator-harness.js";

/**
 * The first and last lines an on-call engineer looks for in a coordinator's log: which build runs,
 * for which deployment, as which instance, on which NATS server and HTTP address; and why it stopped.
 */
let world: World;
beforeAll(async () => {
  world = await startWorld();
});
afterAll(async () => {
  await world?.close();
});

describe("the coordinator's start and stop lines", () => {
  it("name its version, deployment, id, NATS server and HTTP address, and why it stopped", async () => {
    const logged: Record<string, unknown>[] = [];
    const handle = await startCoordinator({
      config: world.config({ coordinator_id: "lines-1" }),
      nc: await world.nats.connect(),
      logger: pino({ level: "info" }, { write: (line: string) => void logged.push(JSON.parse(line) as Record<string, unknown>) }),
    });
    await handle.stop("SIGTERM");
    const started = logged.find((l) => l["msg"] === "coordinator_started");
    expect(started).toMatchObject({
      version: PACKAGE_VERSION,
      protocol_version: PROTOCOL_VERSION,
      deployment: world.deployment,
      coordinator_id: "lines-1",
      nats: new URL(world.nats.server.url).host,
      http: handle.httpUrl,
    });
    expect(logged.find((l) => l["msg"] === "coordinator_stopped")).toMatchObject({ coordinator_id: "lines-1", reason: "SIGTERM" });
  });
});
