import type { Clock } from "../../control-plane/clock.js";

/**
 * The lifetime timers of sessions a seed bound that no request has named since. A seed whose reply
 * never reached its agent leaves a session nobody can name, so no verify or close would ever end it.
 */
export class UnusedSessionTimers {
  private readonly timers = new Map<string, () => void>();

  /** `lifetimeMs` 0: no session expires. */
  constructor(
    private readonly clock: Clock,
    private readonly lifetimeMs: number,
  ) {}

  /** (Re)starts the session's lifetime: `expire` runs once it passed with the session unused. */
  arm(sessionId: string, expire: () => void): void {
    this.cancel(sessionId);
    if (this.lifetimeMs === 0) return;
    const cancel = this.clock.setTimer(() => {
      this.timers.delete(sessionId);
      expire();
    }, this.lifetimeMs);
    this.timers.set(sessionId, cancel);
  }

  /** A request named the session, or it ended: it no longer expires. */
  cancel(sessionId: string): void {
    this.timers.get(sessionId)?.();
    this.timers.delete(sessionId);
  }

  cancelAll(): void {
    for (const cancel of this.timers.values()) cancel();
    this.timers.clear();
  }
}
