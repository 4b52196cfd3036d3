import { describe, expect, it } from "vitest";
import { PARK_RETRY_MAX_MS, PARK_RETRY_MS, ParkBackoff } from "../../../participants/kinds/environment/park-backoff.js";

/** A clock's random source replaying `values` in turn. */
function clockWith(values: number[]): { random: () => number } {
  let i = 0;
  return { random: () => values[i++ % values.length]! };
}

/**
 * Without jitter, thousands of sessions refused at one instant (our own admission's change wakes
 * every parked one) retried in lockstep. Each wait is now drawn in [half, whole] of the grown wait.
 */
describe("park backoff jitter", () => {
  it("draws each wait between half and all of the grown wait, from the clock's random source", () => {
    const low = new ParkBackoff(clockWith([0]));
    const high = new ParkBackoff(clockWith([1]));
    const lows = Array.from({ length: 7 }, () => low.next());
    const highs = Array.from({ length: 7 }, () => high.next());
    expect(highs).toEqual([100, 200, 400, 800, 1600, 2000, 2000]);
    expect(lows).toEqual([50, 100, 200, 400, 800, 1000, 1000]);
  });

  it("spreads sessions refused at the same instant", () => {
    const waits = new Set(Array.from({ length: 100 }, () => new ParkBackoff().next()));
    expect(waits.size).toBeGreaterThan(10);
    for (const w of waits) expect(w).toBeGreaterThanOrEqual(PARK_RETRY_MS / 2);
    for (const w of waits) expect(w).toBeLessThanOrEqual(PARK_RETRY_MAX_MS);
  });

  it("starts over from the shortest wait after reset", () => {
    const backoff = new ParkBackoff(clockWith([1]));
    for (let i = 0; i < 5; i++) backoff.next();
    backoff.reset();
    expect(backoff.next()).toBe(PARK_RETRY_MS);
  });
});
