import type { RandomSource } from "../../protocol/index.js";

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

export const systemClock: Clock = {
  now: () => Date.now(),
  monotonic: () => performance.now(),
  setTimer(fn, ms) {
    const timer = setTimeout(fn, Math.max(0, ms));
    timer.unref?.();
    return () => clearTimeout(timer);
  },
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms))),
};
