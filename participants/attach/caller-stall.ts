import type { ServerResponse } from "node:http";

/**
 * The bound on a caller that stopped reading: an answer paused for the caller's full socket waits
 * at most `waitMs` for a 'drain', then the caller's connection is cut (which drops the upstream
 * call). The wait starts only once the response has the connection: a call an HTTP/1.1 client
 * pipelined behind another waits unattached behind it, and its caller is not the one to blame.
 */
export class CallerStall {
  private timer: NodeJS.Timeout | undefined;
  /** Waiting for the response to get the connection before the timer starts. */
  private arming = false;

  constructor(
    private readonly res: ServerResponse,
    private readonly waitMs: number,
  ) {}

  /** The upstream is paused for the caller: starts the wait, unless it runs already or `wanted()` says no more (when it would start). */
  arm(wanted: () => boolean): void {
    if (this.timer || this.arming || !wanted()) return;
    this.arming = true;
    onceSocket(this.res, () => {
      this.arming = false;
      if (this.timer || this.res.destroyed || !wanted()) return;
      this.timer = setTimeout(() => {
        this.timer = undefined;
        if (!this.res.writableFinished) this.res.destroy();
      }, this.waitMs);
      this.timer.unref();
    });
  }

  /** A 'drain', the end of the upstream's answer, or the caller gone: no wait. */
  clear(): void {
    clearTimeout(this.timer);
    this.timer = undefined;
  }
}

/** Runs `fn` once `res` has the connection (at once if it has). */
export function onceSocket(res: ServerResponse, fn: () => void): void {
  if (res.socket) fn();
  else res.once("socket", () => fn());
}
