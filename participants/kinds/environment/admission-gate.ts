import { monotonicNow, systemClock, type Clock } from "../../control-plane/clock.js";

/**
 * Open/closed admission shared by the step tracker and agent sessions. Work waiting for "open"
 * re-checks after every wake-up, so a new checkpoint that closes again before a parked waiter runs
 * keeps it parked for that checkpoint too.
 */
export class AdmissionGate {
  private closedNow = false;
  private waiters = new Set<() => void>();

  /** The clock runs the `nextChange` timeout, so fake-clock tests control the park retry. */
  constructor(private readonly clock: Clock = systemClock) {}

  get closed(): boolean {
    return this.closedNow;
  }

  close(): void {
    this.closedNow = true;
    this.wakeAll();
  }

  open(): void {
    this.closedNow = false;
    this.wakeAll();
  }

  /** Resolves once admission is open; rejects with the signal's reason when it aborts. */
  async waitOpen(signal?: AbortSignal): Promise<void> {
    while (this.closedNow) await this.nextChange(signal);
    signal?.throwIfAborted();
  }

  /** Resolves at the next open/close (or after `timeoutMs`); rejects when `signal` aborts. */
  nextChange(signal?: AbortSignal, timeoutMs?: number): Promise<void> {
    signal?.throwIfAborted();
    return new Promise<void>((resolve, reject) => {
      let cancelTimer: (() => void) | undefined;
      const done = () => {
        this.waiters.delete(wake);
        signal?.removeEventListener("abort", onAbort);
        cancelTimer?.();
      };
      const wake = () => {
        done();
        resolve();
      };
      const onAbort = () => {
        done();
        reject(signal!.reason);
      };
      this.waiters.add(wake);
      signal?.addEventListener("abort", onAbort, { once: true });
      if (timeoutMs !== undefined) cancelTimer = this.clock.setTimer(wake, timeoutMs);
    });
  }

  /**
   * Runs `fn` with a signal that aborts (with `reason()`) once `ms` passed while admission was open:
   * time closed for a checkpoint does not count, as for the episode deadline. For a call a callee
   * may park until resume, which comes there before it comes here (resume runs callees first).
   */
  async withOpenTimeout<T>(ms: number, reason: () => unknown, fn: (signal: AbortSignal) => Promise<T>): Promise<T> {
    const timeout = new AbortController();
    const done = new AbortController();
    const countdown = async () => {
      for (let left = ms; left > 0; ) {
        if (this.closedNow) {
          await this.nextChange(done.signal);
          continue;
        }
        // Monotonic: a wall-clock step must neither spend the call's time nor give it more.
        const since = monotonicNow(this.clock);
        await this.nextChange(done.signal, left);
        left -= monotonicNow(this.clock) - since;
      }
      timeout.abort(reason());
    };
    countdown().catch(() => undefined); // stopped by `done` once fn settled
    try {
      return await fn(timeout.signal);
    } finally {
      done.abort();
    }
  }

  private wakeAll(): void {
    for (const wake of [...this.waiters]) wake();
  }
}
