/**
 * Stops a participant request in flight from waiting for its reply: for good (`cancel`), or only
 * the try in flight (`interrupt`: the caller may send it again). Not an AbortSignal: each of its
 * listeners costs microseconds on Node 20 (EventTarget bookkeeping), and a checkpoint of 64
 * participants sends ~200 requests that almost never need cancelling. One listener at a time:
 * the one try in flight.
 */
export class Cancellation {
  private cause: Error | undefined;
  private listener: ((reason: Error) => void) | undefined;

  /** Why it was cancelled; undefined while it is not. */
  get reason(): Error | undefined {
    return this.cause;
  }

  cancel(reason: Error): void {
    if (this.cause) return;
    this.cause = reason;
    this.listener?.(reason);
  }

  /** Ends the try in flight (its listener gets `reason`), not the tries after it. */
  interrupt(reason: Error): void {
    if (!this.cause) this.listener?.(reason);
  }

  /** Calls `listener` on cancel or interrupt (at once if cancelled already) until the returned function is called. */
  onCancel(listener: (reason: Error) => void): () => void {
    if (this.cause) {
      listener(this.cause);
      return () => undefined;
    }
    this.listener = listener;
    return () => {
      if (this.listener === listener) this.listener = undefined;
    };
  }
}
