/**
 * Checkpoint requests (SIGUSR1) from the moment `collect` starts: one that arrives before the
 * collector has started is remembered, and those are run as one checkpoint once it has (a
 * checkpoint before its restore finished would race it); later ones run as they come.
 */
export class CheckpointRequests {
  private checkpoint: (() => void) | undefined;
  private waiting = false;

  request(): void {
    if (this.checkpoint) this.checkpoint();
    else this.waiting = true;
  }

  /** From now on each request runs `checkpoint`; the remembered one, if any, runs now. */
  serve(checkpoint: () => void): void {
    this.checkpoint = checkpoint;
    if (!this.waiting) return;
    this.waiting = false;
    checkpoint();
  }
}
