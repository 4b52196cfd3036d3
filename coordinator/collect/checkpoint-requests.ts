/**
 * Checkpoint requests (SIGUSR1) from the moment `collect` starts: one that arrives before the
 * collector has started is remembered, and those are run as one checkpoint once it has (a
 * checkpoint before its restore finished would race it); later ones run as they come.
 * No imports: the CLI's entry module installs the listener before anything else loads.
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

/** The process's SIGUSR1 requests: one queue, whoever listens first (the CLI's entry, or `collect` itself). */
const signalled = new CheckpointRequests();
const onSignal = () => signalled.request();

/** Listens for SIGUSR1 (once, however often called) and returns the requests it collects. */
export function listenForCheckpointSignals(): CheckpointRequests {
  if (!process.listeners("SIGUSR1").includes(onSignal)) process.on("SIGUSR1", onSignal);
  return signalled;
}
