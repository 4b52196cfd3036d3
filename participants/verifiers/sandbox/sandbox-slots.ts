import { availableParallelism } from "node:os";
import { VerifierError } from "../verifier-errors.js";

/**
 * A counting semaphore. Per-case timeouts are wall-clock, so running more sandbox children than
 * there are CPUs would turn machine load into timeouts of correct submissions; runs beyond the
 * capacity wait here, and their clocks only start once their child is running.
 */
export class Slots {
  private busy = 0;
  private readonly waiting: (() => void)[] = [];

  /**
   * `maxQueued`: how many runs may wait; beyond it run() refuses with `sandbox_capacity` (each
   * waiting /verify holds a connection, and a flood must not take every file descriptor).
   */
  constructor(
    readonly capacity: number,
    public maxQueued = Number.POSITIVE_INFINITY,
  ) {
    if (!Number.isInteger(capacity) || capacity < 1) throw new Error("slot capacity must be a positive integer");
  }

  get active(): number {
    return this.busy;
  }

  get queued(): number {
    return this.waiting.length;
  }

  /** Runs `task` once a slot is free. `signal` aborting while it waits takes it out of the queue (rejecting with the reason). */
  async run<T>(task: () => Promise<T>, signal?: AbortSignal): Promise<T> {
    signal?.throwIfAborted();
    if (this.busy < this.capacity) this.busy += 1;
    else if (this.waiting.length >= this.maxQueued) {
      throw new VerifierError("sandbox_capacity", `${this.waiting.length} sandbox runs already wait for a slot (max ${this.maxQueued})`);
    } else {
      await new Promise<void>((resolve, reject) => {
        const onAbort = () => {
          this.waiting.splice(this.waiting.indexOf(granted), 1);
          reject(signal!.reason);
        };
        const granted = () => {
          signal?.removeEventListener("abort", onAbort);
          resolve();
        };
        this.waiting.push(granted);
        signal?.addEventListener("abort", onAbort, { once: true });
      });
    }
    try {
      return await task();
    } finally {
      // Hand the slot straight to the next waiter, so a newcomer cannot overtake the queue.
      const next = this.waiting.shift();
      if (next) next();
      else this.busy -= 1;
    }
  }
}

/** Default of how many sandbox runs may wait for a slot in one verifier process (`--max-sandbox-queue`). */
export const DEFAULT_MAX_SANDBOX_QUEUE = 512;

/** One sandbox child per CPU for the whole process. */
export const SANDBOX_SLOTS = new Slots(Math.max(1, availableParallelism()), DEFAULT_MAX_SANDBOX_QUEUE);
