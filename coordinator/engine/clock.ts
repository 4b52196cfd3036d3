import { MAX_TIMER_MS, type RandomSource } from "../../protocol/index.js";

/** Time source and timers, injectable so deadline and lease logic is testable without sleeping. */
export interface Clock {
  /** Milliseconds since the Unix epoch: for instants (deadlines, timestamps others read). */
  now(): number;
  /** Milliseconds from an arbitrary origin that never steps: for durations, which a wall-clock step (NTP, VM resume) would stretch or cut. */
  monotonic(): number;
  /** Runs `fn` after `ms`; returns a cancel function. */
  setTimer(fn: () => void, ms: number): () => void;
  /** Resolves after `ms` (used only to pace loops, never for correctness). */
  sleep(ms: number): Promise<void>;
  /** What a retry pause's jitter is drawn from, so tests pin it. Optional: without it, Math.random. */
  random?: RandomSource;
}

/**
 * A timer of `ms` on Node's timers. One past setTimeout's 2^31-1 ms (~24.8 days), which Node fires
 * at once with a TimeoutOverflowWarning, is split and re-armed for the rest (Infinity never fires);
 * a negative or NaN delay fires on the next turn, as setTimeout does. Unref'd unless `keepsProcessAlive`.
 */
function durationTimer(fn: () => void, ms: number, { keepsProcessAlive = false } = {}): () => void {
  let left = Number.isNaN(ms) ? 0 : Math.max(0, ms);
  let timer: NodeJS.Timeout;
  const arm = () => {
    const delay = Math.min(left, MAX_TIMER_MS);
    left -= delay;
    timer = setTimeout(() => (left > 0 ? arm() : fn()), delay);
    if (!keepsProcessAlive) timer.unref?.();
  };
  arm();
  return () => clearTimeout(timer);
}

export const systemClock: Clock = {
  now: () => Date.now(),
  monotonic: () => performance.now(),
  setTimer: (fn, ms) => durationTimer(fn, ms),
  // As a plain setTimeout: a sleeping loop keeps the process alive.
  sleep: (ms) => new Promise((resolve) => durationTimer(resolve, ms, { keepsProcessAlive: true })),
};
