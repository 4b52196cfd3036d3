import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { systemClock } from "../../../coordinator/engine/clock.js";

/**
 * The coordinator's own copy of the clock (coordinator/ and participants/ never import each other):
 * its timers hold for delays past setTimeout's 2^31-1 ms (~24.8 days), which Node fires at once
 * with a TimeoutOverflowWarning. A library caller's engine or lease with such a timeout would time
 * out every op at once.
 */
const DAY = 24 * 3600 * 1000;

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

describe("coordinator systemClock.setTimer", () => {
  it("splits a delay beyond setTimeout's 2^31-1 ms instead of firing at once", () => {
    let fired = 0;
    systemClock.setTimer(() => fired++, 30 * DAY);
    vi.advanceTimersByTime(29 * DAY);
    expect(fired).toBe(0);
    vi.advanceTimersByTime(DAY);
    expect(fired).toBe(1);
  });

  it("can be cancelled, also a long one after it re-armed", () => {
    let fired = 0;
    const cancel = systemClock.setTimer(() => fired++, 30 * DAY);
    vi.advanceTimersByTime(26 * DAY); // the first 2^31-1 ms passed: re-armed for the rest
    cancel();
    vi.advanceTimersByTime(10 * DAY);
    expect(fired).toBe(0);
  });

  it("never fires for an infinite delay; fires on the next turn for a negative or NaN one", () => {
    const fired: string[] = [];
    systemClock.setTimer(() => fired.push("infinite"), Infinity);
    systemClock.setTimer(() => fired.push("negative"), -5);
    systemClock.setTimer(() => fired.push("nan"), NaN);
    expect(fired).toEqual([]);
    vi.advanceTimersByTime(1);
    expect(fired.sort()).toEqual(["nan", "negative"]);
    vi.advanceTimersByTime(400 * DAY);
    expect(fired.sort()).toEqual(["nan", "negative"]);
  });
});

describe("coordinator systemClock.sleep", () => {
  it("a sleep past 2^31-1 ms lasts it", async () => {
    let woke = false;
    void systemClock.sleep(30 * DAY).then(() => (woke = true));
    await vi.advanceTimersByTimeAsync(29 * DAY);
    expect(woke).toBe(false);
    await vi.advanceTimersByTimeAsync(DAY);
    expect(woke).toBe(true);
  });
});
