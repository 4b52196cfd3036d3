import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ManualClock, systemClock } from "../../../participants/control-plane/clock.js";

// Fake timers move the timers and Date.now() together; vi.setSystemTime() steps the wall clock
// alone, as NTP does, so a timer can come due before the wall clock reached its instant.
beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

describe("systemClock.setTimerAt", () => {
  it("fires only once the wall clock reached the instant, even if the clock was stepped back meanwhile", () => {
    let fired = 0;
    systemClock.setTimerAt(() => fired++, Date.now() + 20);
    vi.setSystemTime(Date.now() - 150); // the wall clock steps back 150 ms
    vi.advanceTimersByTime(20); // the timer comes due: the wall clock is still 150 ms short
    expect(fired).toBe(0);
    vi.advanceTimersByTime(149);
    expect(fired).toBe(0);
    vi.advanceTimersByTime(1);
    expect(fired).toBe(1);
  });

  it("fires on the next turn for an instant the wall clock already passed", () => {
    let fired = 0;
    systemClock.setTimerAt(() => fired++, Date.now() - 3_600_000);
    expect(fired).toBe(0);
    vi.advanceTimersByTime(1);
    expect(fired).toBe(1);
  });

  it("can be cancelled, also after it re-armed", () => {
    let fired = 0;
    const cancel = systemClock.setTimerAt(() => fired++, Date.now() + 10);
    vi.setSystemTime(Date.now() - 60);
    vi.advanceTimersByTime(10); // came due early and re-armed for the rest
    cancel();
    vi.advanceTimersByTime(1000);
    expect(fired).toBe(0);
  });
});

describe("systemClock.setTimer", () => {
  it("is a duration: a wall-clock step back (NTP, a VM resume) neither delays nor stretches it", () => {
    let fired = 0;
    systemClock.setTimer(() => fired++, 1000);
    vi.setSystemTime(Date.now() - 3_600_000); // the wall clock steps back an hour
    vi.advanceTimersByTime(1000);
    expect(fired).toBe(1);
  });

  it("splits a delay beyond setTimeout's 2^31-1 ms instead of firing at once", () => {
    let fired = 0;
    const day = 24 * 3600 * 1000;
    systemClock.setTimer(() => fired++, 30 * day);
    vi.advanceTimersByTime(29 * day);
    expect(fired).toBe(0);
    vi.advanceTimersByTime(day);
    expect(fired).toBe(1);
  });

  it("can be cancelled, also a long one after it re-armed", () => {
    let fired = 0;
    const day = 24 * 3600 * 1000;
    const cancel = systemClock.setTimer(() => fired++, 30 * day);
    vi.advanceTimersByTime(26 * day); // the first 2^31-1 ms passed: re-armed for the rest
    cancel();
    vi.advanceTimersByTime(10 * day);
    expect(fired).toBe(0);
  });
});

/**
 * ManualClock stands in for systemClock in the control-plane tests, so its instants behave alike
 * across a wall-clock step: a step forward does not hasten a timer already armed (docs/operations.md,
 * Clocks), a step back holds it until the wall clock gets there.
 */
describe("ManualClock.setTimerAt, as systemClock's", () => {
  it.each([
    ["systemClock", () => ({ set: systemClock.setTimerAt.bind(systemClock), now: () => Date.now(), step: (ms: number) => vi.setSystemTime(Date.now() + ms), advance: (ms: number) => vi.advanceTimersByTime(ms) })],
    [
      "ManualClock",
      () => {
        const clock = new ManualClock();
        return { set: clock.setTimerAt.bind(clock), now: () => clock.now(), step: (ms: number) => clock.stepWall(ms), advance: (ms: number) => clock.advance(ms) };
      },
    ],
  ])("%s: a step forward does not fire an armed timer early; a step back holds it", (_name, make) => {
    const c = make();
    const fired: string[] = [];
    c.set(() => fired.push("ahead"), c.now() + 1000);
    c.step(3_600_000); // the wall clock steps an hour forward
    c.advance(1);
    expect(fired).toEqual([]);
    c.advance(999);
    expect(fired).toEqual(["ahead"]);
    c.set(() => fired.push("back"), c.now() + 1000);
    c.step(-500); // half a second back
    c.advance(1000);
    expect(fired).toEqual(["ahead"]);
    c.advance(500);
    expect(fired).toEqual(["ahead", "back"]);
  });
});
