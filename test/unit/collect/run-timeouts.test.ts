import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { RunTimeouts } from "../../../coordinator/collect/run-timeouts.js";

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

describe("/run timeouts", () => {
  it("do not count the time a checkpoint keeps the episodes parked", () => {
    const timeouts = new RunTimeouts();
    const run = timeouts.start(1000);
    vi.advanceTimersByTime(600);
    timeouts.pause(); // the collector's checkpoint closes the gate
    vi.advanceTimersByTime(5000);
    expect(run.signal.aborted).toBe(false);
    timeouts.resume();
    vi.advanceTimersByTime(399);
    expect(run.signal.aborted).toBe(false);
    vi.advanceTimersByTime(1);
    expect(run.signal.aborted).toBe(true);
    expect((run.signal.reason as DOMException).name).toBe("TimeoutError");
  });

  it("a call started while paused starts counting at resume; a finished call never fires", () => {
    const timeouts = new RunTimeouts();
    timeouts.pause();
    const late = timeouts.start(100);
    const finished = timeouts.start(100);
    vi.advanceTimersByTime(1000);
    expect(late.signal.aborted).toBe(false);
    finished.done();
    timeouts.resume();
    vi.advanceTimersByTime(100);
    expect([late.signal.aborted, finished.signal.aborted]).toEqual([true, false]);
  });

  // Before, the pause was measured with Date.now(): a step forward spent the call's time (it timed
  // out at resume), a step back gave it an hour more.
  it.each([3_600_000, -3_600_000])("a wall-clock step (%i ms) while a call runs neither spends its time nor gives it more", (step) => {
    const timeouts = new RunTimeouts();
    const run = timeouts.start(1000);
    vi.advanceTimersByTime(600);
    vi.setSystemTime(Date.now() + step); // NTP, a VM resume: the wall clock only
    timeouts.pause();
    timeouts.resume();
    vi.advanceTimersByTime(399);
    expect(run.signal.aborted).toBe(false);
    vi.advanceTimersByTime(1);
    expect(run.signal.aborted).toBe(true);
  });
});
