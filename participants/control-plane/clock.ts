import { timerDelay, type RandomSource } from "../../protocol/index.js";

/** Time source and timers, injectable so lease tests advance time instead of sleeping. */
export interface Clock {
  /** Milliseconds since the Unix epoch. */
  now(): number;
  /**
   * Milliseconds from an arbitrary origin that never steps: for durations (metrics), which a
   * wall-clock step (NTP, VM resume) would stretch or make negative. Optional: without it, now().
   */
  monotonic?(): number;
  /** Runs `fn` after `ms`; returns a cancel function. */
  setTimer(fn: () => void, ms: number): () => void;
  /** What a timer's jitter is drawn from (ParkBackoff), so tests pin it. Optional: without it, Math.random. */
  random?: RandomSource;
}

export const systemClock: Clock = {
  now: () => Date.now(),
  monotonic: () => performance.now(),
  setTimer(fn, ms) {
    // Deadlines and leases are wall-clock instants, timers run on the monotonic clock: a timer can
    // fire a moment before Date.now() reaches the instant (or long before it, after a clock step).
    // It fires `fn` only once the wall clock got there, re-arming for what is left.
    const at = Date.now() + ms;
    let timer: NodeJS.Timeout;
    const arm = (delay: number) => {
      timer = setTimeout(tick, timerDelay(delay)); // longer than ~24.8 days: split, re-armed by tick
      timer.unref?.();
    };
    const tick = () => {
      const left = at - Date.now();
      if (left > 0) arm(left);
      else fn();
    };
    arm(ms);
    return () => clearTimeout(timer);
  },
};

/**
 * A clock that only moves when told to; timers fire during `advance`. For tests. Its random source
 * is fixed too: by default 1, a jittered wait at its top (the whole grown wait).
 */
export class ManualClock implements Clock {
  private timers: { at: number; fn: () => void; id: number }[] = [];
  private nextId = 0;

  constructor(
    private current = 1_700_000_000_000,
    readonly random: RandomSource = () => 1,
  ) {}

  now(): number {
    return this.current;
  }

  setTimer(fn: () => void, ms: number): () => void {
    const id = this.nextId++;
    this.timers.push({ at: this.current + Math.max(0, ms), fn, id });
    return () => {
      this.timers = this.timers.filter((t) => t.id !== id);
    };
  }

  /** Timers set and neither fired nor cancelled: a test sees that nothing is left scheduled. */
  get pendingTimers(): number {
    return this.timers.length;
  }

  advance(ms: number): void {
    const target = this.current + ms;
    for (;;) {
      const due = this.timers.filter((t) => t.at <= target).sort((a, b) => a.at - b.at)[0];
      if (!due) break;
      this.timers = this.timers.filter((t) => t.id !== due.id);
      this.current = Math.max(this.current, due.at);
      due.fn();
    }
    this.current = target;
  }
}
