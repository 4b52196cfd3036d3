import { afterEach, describe, expect, it, vi } from "vitest";
import { systemClock } from "../../../participants/control-plane/clock.js";

afterEach(() => {
  vi.restoreAllMocks();
});

describe("systemClock.setTimer", () => {
  it("fires only once the wall clock reached the instant, even if the clock was stepped back meanwhile", async () => {
    const realNow = Date.now.bind(Date);
    let stepBack = 0;
    vi.spyOn(Date, "now").mockImplementation(() => realNow() - stepBack);
    const armed = realNow();
    const fired = new Promise<number>((resolve) => systemClock.setTimer(() => resolve(realNow()), 20));
    stepBack = 150; // an NTP step: the 20 ms timer fires while the wall clock still reads 130 ms short
    const at = await fired;
    expect(at - armed).toBeGreaterThanOrEqual(165);
  });

  it("can be cancelled, also after it re-armed", async () => {
    const realNow = Date.now.bind(Date);
    let stepBack = 0;
    vi.spyOn(Date, "now").mockImplementation(() => realNow() - stepBack);
    let calls = 0;
    const cancel = systemClock.setTimer(() => calls++, 10);
    stepBack = 60;
    await new Promise((resolve) => setTimeout(resolve, 30)); // the first timer has fired and re-armed
    cancel();
    await new Promise((resolve) => setTimeout(resolve, 80));
    expect(calls).toBe(0);
  });
});
