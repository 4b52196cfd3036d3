import pino from "pino";
import { afterAll, afterEach, beforeAll, describe, expect, it, vi } from "vitest";
import { startCoordinator } from "../../coordinator/daemon/coordinator-daemon.js";
import { CheckpointEngine } from "../../coordinator/engine/checkpoint-engine.js";
import { systemClock } from "../../coordinator/engine/clock.js";
import { NO_HTTP, startWorld, type World } from "./coordinator-harness.js";

let world: World;
beforeAll(async () => {
  world = await startWorld();
});
afterAll(async () => {
  await world?.close();
});
afterEach(() => vi.restoreAllMocks());

// Coordinators whose recovery failed in one outage (the journal unreadable) must not retry in step.
describe("coordinator recovery retry", () => {
  it("waits a jittered pause (equal jitter, from the clock's random source) before retrying a failed recovery", async () => {
    vi.spyOn(CheckpointEngine.prototype, "recover").mockRejectedValueOnce(new Error("journal unreadable"));
    // The pause is the first timer set right after recovery_failed is logged (synchronously).
    let capture = false;
    const pauses: number[] = [];
    const realSetTimeout = globalThis.setTimeout;
    vi.spyOn(globalThis, "setTimeout").mockImplementation(((fn: () => void, ms?: number) => {
      if (capture) {
        capture = false;
        pauses.push(ms ?? 0);
      }
      return realSetTimeout(fn, ms);
    }) as typeof setTimeout);
    const logger = pino({ level: "error" }, { write: (line: string) => void (line.includes('"recovery_failed"') && (capture = true)) });
    const nc = await world.nats.connect();
    const handle = await startCoordinator({ config: world.config(NO_HTTP), nc, logger, clock: { ...systemClock, random: () => 0 } });
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
