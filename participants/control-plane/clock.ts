import { MAX_TIMER_MS, type RandomSource } from "../../protocol/index.js";

/** Time source and timers, injectable so lease tests advance time instead of sleeping. */
export interface Clock {
  /** Milliseconds since the Unix epoch: for instants (deadlines, leases, timestamps others read). */
  now(): number;
  /**
   * Milliseconds from an arbitrary origin that never steps: for durations (metrics, time budgets),
   * which a wall-clock step (NTP, VM resume) would stretch or make negative. Optional: without it, now().
   */
  monotonic?(): number;
  /** Runs `fn` after `ms` have passed (a duration: a wall-clock step neither delays nor hastens it); returns a cancel function. */
  setTimer(fn: () => void, ms: number): () => void;
  /**
   * Runs `fn` once `now()` reached `atMs` (an instant: a deadline, a lease's expiry); returns a cancel
   * function. Optional: without it, `setTimer` for the time left now (see `setTimerAt`).
   */
  setTimerAt?(fn: () => void, atMs: number): () => void;
  /** What a timer's jitter is drawn from (ParkBackoff), so tests pin it. Optional: without it, Math.random. */
  random?: RandomSource;
}

/** Now on `clock`'s monotonic clock (its wall clock if it has none): for measuring durations. */
export function monotonicNow(clock: Clock): number {
  return clock.monotonic?.() ?? clock.now();
}

/** Runs `fn` once `clock`'s wall clock reached the instant `atMs`; returns a cancel function. */
export function setTimerAt(clock: Clock, fn: () => void, atMs: number): () => void {
  return clock.setTimerAt ? clock.setTimerAt(fn, atMs) : clock.setTimer(fn, atMs - clock.now());
}

/** A timer of `ms` on Node's (monotonic) timers; one past ~24.8 days is split, re-armed for the rest. */
function durationTimer(fn: () => void, ms: number): () => void {
  let left = Math.max(0, ms);
  let timer: NodeJS.Timeout;
  const arm = () => {
    const delay = Math.min(left, MAX_TIMER_MS);
    left -= delay;
    timer = setTimeout(() => (left > 0 ? arm() : fn()), delay);
    timer.unref?.();
  };
  arm();
  return () => clearTimeout(timer);
}

export const systemClock: Clock & Required<Pick<Clock, "monotonic" | "setTimerAt">> = {
  now: () => Date.now(),
  monotonic: () => performance.now(),
  setTimer: durationTimer,
  setTimerAt(fn, atMs) {
    // Timers run on the monotonic clock, instants on the wall clock: a timer can come due a moment
    // before now() reaches the instant (or long before it, after a step back). It fires `fn` only
    // once the wall clock got there, re-arming for what is left. `this.now()`: a copy of this clock
    // with another `now` (a skewed test clock) waits for its own instant.
    const now = () => this.now();
    let cancel: () => void;
    const tick = () => {
      const left = atMs - now();
      if (left > 0) cancel = durationTimer(tick, left);
      else fn();
    };
    cancel = durationTimer(tick, atMs - now());
    return () => cancel();
  },
};

/**
 * A clock that only moves when told to; timers fire during `advance`. For tests. Its random source
 * is fixed too: by default 1, a jittered wait at its top (the whole grown wait). `stepWall` steps
 * the wall clock alone (NTP, a VM resume): durations (`monotonic`, `setTimer`) do not see it, instants
 * (`now`, `setTimerAt`) do.
 */
export class ManualClock implements Clock {
  private timers: { at: number; fn: () => void; id: number }[] = [];
  private nextId = 0;
  private wallOffset = 0;

  constructor(
    private current = 1_700_000_000_000,
    readonly random: RandomSource = () => 1,
  ) {}

  now(): number {
    return this.current + this.wallOffset;
  }

  monotonic(): number {
    return this.current;
  }

  setTimer(fn: () => void, ms: number): () => void {
    const id = this.nextId++;
    this.timers.push({ at: this.current + Math.max(0, ms), fn, id });
    return () => {
      this.timers = this.timers.filter((t) => t.id !== id);
    };
  }

  /**
   * As systemClock's: armed for the time left now, re-armed for the rest while the wall clock is
   * short of the instant when it comes due. So a step forward does not hasten an armed timer, and a
   * step back holds it until the wall clock gets there.
   */
  setTimerAt(fn: () => void, atMs: number): () => void {
    let cancel: () => void;
    const tick = () => {
      const left = atMs - this.now();
      if (left > 0) cancel = this.setTimer(tick, left);
      else fn();
    };
    cancel = this.setTimer(tick, atMs - this.now());
    return () => cancel();
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

  /** Steps the wall clock by `ms` (either way) without time passing: no timer fires for it. */
  stepWall(ms: number): void {
    this.wallOffset += ms;
  }
}
