import { timerDelay } from "../../protocol/index.js";

/**
 * Timeouts of the `/run` calls in flight that stand still while the collector's own checkpoint
 * keeps their episodes parked: parked time is not the episode's, and a long checkpoint would
 * otherwise time rows out (each one then retried as a new attempt). Timed on performance.now(): a
 * wall-clock step during a pause must neither spend a call's time nor give it more.
 */
export class RunTimeouts {
  private readonly active = new Set<Entry>();
  private pausedAt: number | undefined;

  /** A signal that aborts (`TimeoutError`) once `ms` of unpaused time passed; `done` when the call ended. */
  start(ms: number): { signal: AbortSignal; done: () => void } {
    const entry: Entry = { controller: new AbortController(), remaining: ms, startedAt: 0, timer: undefined };
    this.active.add(entry);
    if (this.pausedAt === undefined) this.arm(entry);
    return {
      signal: entry.controller.signal,
      done: () => {
        clearTimeout(entry.timer);
        this.active.delete(entry);
      },
    };
  }

  /** How many calls are in flight (started, not yet done or timed out). */
  get inFlight(): number {
    return this.active.size;
  }

  /** Aborts every call in flight now (the collection gave up). */
  abortAll(): void {
    for (const entry of this.active) {
      clearTimeout(entry.timer);
      entry.controller.abort(new DOMException("the collection stopped", "AbortError"));
    }
    this.active.clear();
  }

  pause(): void {
    if (this.pausedAt !== undefined) return;
    this.pausedAt = performance.now();
    for (const entry of this.active) {
      clearTimeout(entry.timer);
      entry.remaining -= this.pausedAt - entry.startedAt;
    }
  }

  resume(): void {
    if (this.pausedAt === undefined) return;
    this.pausedAt = undefined;
    for (const entry of this.active) this.arm(entry);
  }

  private arm(entry: Entry): void {
    entry.startedAt = performance.now();
    entry.timer = setTimeout(
      () => {
        this.active.delete(entry);
        entry.controller.abort(new DOMException("the /run call timed out", "TimeoutError"));
      },
      timerDelay(entry.remaining),
    );
  }
}

interface Entry {
  controller: AbortController;
  /** Unpaused time left (ms) as of `startedAt`. */
  remaining: number;
  /** performance.now() when last armed. */
  startedAt: number;
  timer: NodeJS.Timeout | undefined;
}
