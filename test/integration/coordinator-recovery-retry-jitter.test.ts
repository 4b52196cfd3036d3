import pino from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startCoordinator } from "../../coordinator/daemon/coordinator-daemon.js";
import { systemClock } from "../../coordinator/engine/clock.js";
import { NO_HTTP, startWorld, type World } from "./coordinator-harness.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
});
afterAll(async () => {
  await world?.close();
});

// Coordinators whose recovery failed in one outage (the journal unreadable) must not retry in step.
describe("coordinator recovery retry", () => {
  it("waits a jittered pause (equal jitter, from the clock's random source) before retrying a failed recovery", async () => {
    const pauses: number[] = [];
    const hooks = {
      // The first attempt fails as an unreadable journal would fail engine.recover().
      beforeRecover: (_epoch: number, attempt: number) => {
        if (attempt === 1) throw new Error("journal unreadable");
      },
      onRecoveryRetryPause: (pauseMs: number) => void pauses.push(pauseMs),
    };
    const nc = await world.nats.connect();
    const handle = await startCoordinator({ config: world.config(NO_HTTP), nc, logger: pino({ level: "silent" }), clock: { ...systemClock, random: () => 0 }, hooks });
    try {
      await handle.whenReady();
      // The first retry's grown pause is 500 ms; drawn at 0, equal jitter keeps half of it.
      expect(pauses).toEqual([250]);
    } finally {
      await handle.stop();
      await nc.close(); // a connection handed in is not closed by stop()
    }
  });
});
