import type { RowCounts } from "./collection-telemetry.js";

export type RowStatus = keyof RowCounts;

/**
 * What the queue reads of a row: its status, the failed attempt whose retire it waits for, and
 * whether it continues a restored checkpoint (set through `setRestored`).
 */
export interface QueuedRow {
  status: RowStatus;
  retiring?: number;
  restored?: boolean;
}

/** Consumed entries of the retry queue are cut off once there are this many (and they are half of it). */
const COMPACT_AT = 1024;

/**
 * The collector's rows counted by status as they change, and its pending rows in the order they
 * are sent: a dispatch or a finished row costs O(1) (amortized), where scanning every row each
 * time would make a collection's CPU cost grow with the square of its row count.
 *
 * Rows never sent go in input order; a row sent again after a failure goes ahead of them once the
 * retire of its failed attempt has finished, and so does a row a restore continues (`sendFirst`).
 */
export class RowQueue<S extends QueuedRow> {
  readonly counts: RowCounts = { pending: 0, inflight: 0, done: 0, failed: 0 };
  private readonly fresh: S[] = [];
  private freshAt = 0;
  private retried: S[] = [];
  private retriedAt = 0;
  /**
   * The rows every checkpoint's scope holds: in flight, or restored and not sent yet. Kept as they
   * change: found by walking every row, a checkpoint kept the Gym parked 72 ms longer at a million rows.
   */
  private readonly openRows = new Set<S>();

  /** A row as start-up found it (pending, or done by an earlier run). */
  add(row: S): void {
    this.counts[row.status]++;
    this.fresh.push(row);
    this.track(row, row.status);
  }

  set(row: S, status: RowStatus): void {
    this.counts[row.status]--;
    this.counts[status]++;
    row.status = status;
    if (status === "pending" && row.retiring === undefined) this.retried.push(row);
    this.track(row, status);
  }

  /** The row continues a restored checkpoint (or no longer does). */
  setRestored(row: S, restored: boolean): void {
    row.restored = restored;
    this.track(row, row.status);
  }

  /** The rows in flight and the restored rows not sent yet, in no particular order. */
  open(): S[] {
    return [...this.openRows];
  }

  private track(row: S, status: RowStatus): void {
    if (status === "inflight" || (status === "pending" && row.restored === true)) this.openRows.add(row);
    else this.openRows.delete(row);
  }

  /**
   * A pending row goes ahead of the rows never sent: a restored row, whose episode waits parked at
   * the Gym. Until sent it is in every checkpoint's scope beside the rows in flight, so sent first
   * the two together never outnumber max(workers, restored rows): the bound scope-ceiling.ts relies on.
   * Its place in input order is skipped once it was sent (only pending rows are taken).
   */
  sendFirst(row: S): void {
    if (sendable(row)) this.retried.push(row);
  }

  /** The retire a pending row waited for finished: it may be sent again. */
  retireDone(row: S): void {
    if (row.status === "pending" && row.retiring === undefined) this.retried.push(row);
  }

  /** The next row to send, or undefined when every pending row waits for a retire (or none is left). */
  next(): S | undefined {
    while (this.retriedAt < this.retried.length) {
      const row = this.retried[this.retriedAt++]!;
      this.compact();
      if (sendable(row)) return row;
    }
    while (this.freshAt < this.fresh.length) {
      const row = this.fresh[this.freshAt++]!;
      if (sendable(row)) return row;
    }
    return undefined;
  }

  private compact(): void {
    if (this.retriedAt >= COMPACT_AT && this.retriedAt * 2 >= this.retried.length) {
      this.retried = this.retried.slice(this.retriedAt);
      this.retriedAt = 0;
    }
  }
}

function sendable(row: QueuedRow): boolean {
  return row.status === "pending" && row.retiring === undefined;
}
