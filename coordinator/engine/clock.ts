/** Time source and timers, injectable so deadline and lease logic is testable without sleeping. */
export interface Clock {
  /** Milliseconds since the Unix epoch. */
  now(): number;
  /** Runs `fn` after `ms`; returns a cancel function. */
  setTimer(fn: () => void, ms: number): () => void;
  /** Resolves after `ms` (used only to pace loops, never for correctness). */
  sleep(ms: number): Promise<void>;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  setTimer(fn, ms) {
    const timer = setTimeout(fn, Math.max(0, ms));
    timer.unref?.();
    return () => clearTimeout(timer);
  },
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, Math.max(0, ms))),
};
