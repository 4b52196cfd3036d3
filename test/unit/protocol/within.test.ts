import { describe, expect, it } from "vitest";
import { finishedWithin, within } from "../../../protocol/index.js";

/** A timer that fires only when told to, and says whether it was cleared. */
function manualTimer() {
  let fire: (() => void) | undefined;
  let cleared = false;
  return {
    setTimer: (fn: () => void) => ((fire = fn), () => void (cleared = true)),
    fire: () => fire?.(),
    cleared: () => cleared,
  };
}

describe("within", () => {
  it("answers with the work when it settles first, and clears its timer", async () => {
    const timer = manualTimer();
    await expect(within(Promise.resolve(7), 50, timer.setTimer)).resolves.toBe(7);
    expect(timer.cleared()).toBe(true);
  });

  it("passes the work's own failure on", async () => {
    await expect(within(Promise.reject(new Error("refused")), 50, manualTimer().setTimer)).rejects.toThrow("refused");
  });

  it("rejects naming the wait once the time passes first; the work's later failure is not unhandled", async () => {
    const timer = manualTimer();
    let fail: (error: Error) => void = () => undefined;
    const work = new Promise<number>((_, reject) => (fail = reject));
    const raced = within(work, 50, timer.setTimer);
    timer.fire();
    await expect(raced).rejects.toThrow("no answer within 50 ms");
    fail(new Error("late")); // vitest fails the run on an unhandled rejection
    await new Promise((resolve) => setImmediate(resolve));
  });

  it("uses a real timer by default", async () => {
    await expect(within(new Promise<never>(() => undefined), 5)).rejects.toThrow("no answer within 5 ms");
  });
});

describe("finishedWithin", () => {
  it("is true when the work resolves first, and clears its timer", async () => {
    const timer = manualTimer();
    await expect(finishedWithin(Promise.resolve(7), 50, timer.setTimer)).resolves.toBe(true);
    expect(timer.cleared()).toBe(true);
  });

  it("is false once the time passes first; the work's later failure is not unhandled", async () => {
    const timer = manualTimer();
    let fail: (error: Error) => void = () => undefined;
    const raced = finishedWithin(new Promise((_, reject) => (fail = reject)), 50, timer.setTimer);
    timer.fire();
    await expect(raced).resolves.toBe(false);
    fail(new Error("late"));
    await new Promise((resolve) => setImmediate(resolve));
  });

  it("passes the work's own failure on", async () => {
    await expect(finishedWithin(Promise.reject(new Error("refused")), 50, manualTimer().setTimer)).rejects.toThrow("refused");
  });
});
