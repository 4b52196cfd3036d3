import type { Logger } from "pino";
import { CheckpointError, isStorageFailure } from "../../../protocol/index.js";

/** How often, at most, a refused call tries the ledger's storage again (default). */
export const LEDGER_PROBE_INTERVAL_MS = 1000;

/**
 * The capture ledger's storage refusing writes (a full disk, EIO, a read-only mount). A call whose
 * row could not be written is cut off (its caller never holds an answer the ledger lacks); while the
 * storage keeps refusing, every later call would be generated in full only to be cut off too. So
 * once a row's write fails so, new calls are refused before they reach the backend, with
 * `storage_error` (507): callers see the operator's problem, not a dropped connection, and a
 * controller can wait instead of spending attempts. Admission tries the storage again itself
 * (a probe write, at most every `probeIntervalMs`): the first that succeeds ends the outage.
 */
export class LedgerOutage {
  /** The refusal while the storage refuses writes; undefined while it takes them. */
  private refusal: CheckpointError | undefined;
  private since = 0;
  private probedAt = 0;
  private probing: Promise<void> | undefined;
  /** Rows' writes failed so far: one failing while a probe ran keeps the outage, whatever the probe found. */
  private failures = 0;

  constructor(
    /** The ledger's directory, which refusals name (not the file of the call that failed: another rollout's). */
    private readonly dir: string,
    private readonly probe: () => Promise<void>,
    private readonly probeIntervalMs: number,
    private readonly logger: Logger | undefined,
  ) {}

  /** What calls are refused with while the storage refused writes, as of the last call (status shows it); null otherwise. */
  get refusing(): string | null {
    return this.refusal?.message ?? null;
  }

  /** A row's write failed: a storage failure begins (or goes on with) an outage; anything else is not one. */
  failed(error: unknown): void {
    if (!isStorageFailure(error)) return;
    this.failures += 1;
    if (this.refusal === undefined) {
      this.since = performance.now();
      this.logger?.error({ err: error }, "the capture ledger cannot be written: new generation calls are refused with storage_error until a test write succeeds");
    }
    this.refusal = this.refusalOf(error);
    this.probedAt = performance.now();
  }

  /** Resolves when a call may be admitted; rejects with `storage_error` while the storage still refuses writes. */
  async admit(): Promise<void> {
    if (this.refusal === undefined) return;
    // One probe at a time, shared by the calls arriving meanwhile; between probes, refused at once.
    if (this.probing === undefined) {
      if (performance.now() - this.probedAt < this.probeIntervalMs) throw this.refusal;
      this.probing = this.tryStorage().finally(() => (this.probing = undefined));
    }
    await this.probing;
    if (this.refusal !== undefined) throw this.refusal;
  }

  private async tryStorage(): Promise<void> {
    const failures = this.failures;
    try {
      await this.probe();
    } catch (error) {
      // Not a storage failure (a bug, say): the outage is not known to be over, so the old refusal stays.
      if (isStorageFailure(error)) this.refusal = this.refusalOf(error);
      this.probedAt = performance.now();
      return;
    }
    if (this.failures !== failures) return;
    this.logger?.info({ outage_s: Math.round((performance.now() - this.since) / 100) / 10 }, "the capture ledger can be written again: generation calls are admitted");
    this.refusal = undefined;
  }

  private refusalOf(error: unknown): CheckpointError {
    const { code, syscall } = error as { code: string; syscall: string };
    return new CheckpointError(
      "storage_error",
      `the capture ledger in ${this.dir} cannot be written (${code} on ${syscall}): generation calls are refused until it can; free space or fix the mount, then retry`,
      { cause: error },
    );
  }
}
