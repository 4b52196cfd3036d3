import { CheckpointError } from "../../protocol/index.js";

/**
 * Lets resume stop a pending checkpoint write. Once `stop()` returns, the write can no longer
 * publish its manifest; a publication already under way is awaited, never torn.
 */
export class WriteGate {
  private stopped = false;
  private publishing: Promise<void> | undefined;

  get isStopped(): boolean {
    return this.stopped;
  }

  throwIfStopped(): void {
    if (this.stopped) throw new CheckpointError("stale_checkpoint", "the checkpoint was resumed; its write was stopped");
  }

  async publish<T>(fn: () => Promise<T>): Promise<T> {
    this.throwIfStopped();
    let done!: () => void;
    this.publishing = new Promise<void>((resolve) => (done = resolve));
    try {
      return await fn();
    } finally {
      this.publishing = undefined;
      done();
    }
  }

  async stop(): Promise<void> {
    this.stopped = true;
    await this.publishing;
  }
}
