import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startCoordinator } from "../../coordinator/daemon/coordinator-daemon.js";
import { waitUntil } from "../support/wait-until.js";
import { startWorld, type World } from "./coordinator-harness.js";

/** What an on-call engineer needs to see when the coordinator's NATS goes away and comes back. */
let world: World;
beforeAll(async () => {
  world = await startWorld();
});
afterAll(async () => {
  await world?.close();
});

describe("the coordinator's NATS connection lines", () => {
  it("one warning when the connection drops, reconnect attempts at debug, one info line with how long it was down when it is back", { timeout: 30_000 }, async () => {
    const logged: { level: number; msg: string; down_s?: number; server?: string }[] = [];
    const handle = await startCoordinator({
      config: world.config({ coordinator_id: "nats-lines-1" }),
      nc: await world.nats.connect(),
      logger: pino({ level: "debug" }, { write: (line: string) => void logged.push(JSON.parse(line)) }),
    });
    try {
      await world.nats.server.kill();
      await waitUntil(() => logged.some((l) => l.msg === "nats_disconnected"), "nats_disconnected logged", 10_000);
      // A while down: the client tries again every 100 ms.
      await waitUntil(() => logged.filter((l) => l.msg === "nats_reconnecting").length >= 3, "reconnect attempts logged", 10_000);
      await world.nats.server.restart();
      await waitUntil(() => logged.some((l) => l.msg === "nats_reconnected"), "nats_reconnected logged", 15_000);
      expect(logged.filter((l) => l.msg === "nats_disconnected" && l.level >= 40)).toEqual([expect.objectContaining({ level: 40, server: expect.any(String) })]);
      expect(logged.filter((l) => l.msg === "nats_reconnecting").every((l) => l.level === 20)).toBe(true);
      expect(logged.filter((l) => l.msg === "nats_reconnected")).toEqual([expect.objectContaining({ level: 30, down_s: expect.any(Number) })]);
      expect(logged.find((l) => l.msg === "nats_reconnected")!.down_s).toBeGreaterThan(0);
    } finally {
      await handle.stop("SIGTERM");
    }
  });
});
