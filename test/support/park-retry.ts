import { expect } from "vitest";
import type { ManualClock } from "../../participants/control-plane/clock.js";

const flush = () => new Promise((resolve) => setImmediate(resolve));

/** Asserts a parked call retries when `clock` reaches `retryMs` from now, and not a millisecond before. */
export async function expectRetryAfter(clock: ManualClock, retryMs: number, retried: () => boolean): Promise<void> {
  clock.advance(retryMs - 1);
  await flush();
  expect(retried()).toBe(false);
  clock.advance(1);
  await flush();
  expect(retried()).toBe(true);
}
