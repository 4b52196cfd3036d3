import { CheckpointError } from "../../../protocol/index.js";

/**
 * Open while no checkpoint is open. Requests that must not run during a checkpoint wait here
 * for resume instead of being refused (a caller that closes a session does so only once).
 */
export class AdmissionGate {
  private open = true;
  private waiters = new Set<() => void>();

  get isOpen(): boolean {
    return this.open;
  }

  /** Requests currently waiting for the gate to open. */
  get waiting(): number {
    return this.waiters.size;
  }

  close(): void {
    this.open = false;
  }

  reopen(): void {
    this.open = true;
    const waiters = [...this.waiters];
    this.waiters.clear();
    for (const wake of waiters) wake();
  }

  /** Resolves once the gate is open; rejects if `signal` aborts first (the client went away). */
  async waitOpen(signal?: AbortSignal): Promise<void> {
    // Re-check after every wake: a new checkpoint may close the gate again before we run.
    while (!this.open) {
      if (signal?.aborted) throw new CheckpointError("admission_closed", "the client went away while waiting for resume");
      await new Promise<void>((resolve) => {
        const wake = () => {
          signal?.removeEventListener("abort", wake);
          this.waiters.delete(wake);
          resolve();
        };
        this.waiters.add(wake);
        signal?.addEventListener("abort", wake, { once: true });
      });
    }
  }
}
