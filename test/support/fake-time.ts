import { vi } from "vitest";

/**
 * Lets `ms` of fake time pass a second at a time, with real I/O turns in between (vitest's fake
 * timers must be installed): for tests of limits minutes long, such as fetch's own 300 s.
 */
export async function passFakeTime(ms: number): Promise<void> {
  for (let t = 0; t < ms; t += 1000) {
    await vi.advanceTimersByTimeAsync(1000);
    await new Promise((resolve) => setImmediate(resolve));
  }
}
