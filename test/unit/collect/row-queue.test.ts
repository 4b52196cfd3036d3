import { describe, expect, it } from "vitest";
import { RowQueue, type QueuedRow, type RowStatus } from "../../../coordinator/collect/row-queue.js";

/** A row that counts how often its status is read: the queue's work, without a clock. */
function row(id: string, status: RowStatus = "pending") {
  let value = status;
  const r = { id, reads: 0 } as QueuedRow & { id: string; reads: number };
  Object.defineProperty(r, "status", {
    get: () => (r.reads++, value),
    set: (s: RowStatus) => (value = s),
    enumerable: true,
  });
  return r;
}

describe("row queue", () => {
  it("sends rows in input order, skips rows already done, and counts rows by status", () => {
    const queue = new RowQueue<ReturnType<typeof row>>();
    const rows = [row("a"), row("b", "done"), row("c")];
    for (const r of rows) queue.add(r);
    expect(queue.counts).toEqual({ pending: 2, inflight: 0, done: 1, failed: 0 });
    const a = queue.next()!;
    queue.set(a, "inflight");
    const c = queue.next()!;
    queue.set(c, "inflight");
    expect([a.id, c.id]).toEqual(["a", "c"]);
    expect(queue.next()).toBeUndefined();
    queue.set(a, "done");
    queue.set(c, "failed");
    expect(queue.counts).toEqual({ pending: 0, inflight: 0, done: 2, failed: 1 });
  });

  it("holds a failed row back until its retire is done, then sends it before rows never sent", () => {
    const queue = new RowQueue<ReturnType<typeof row>>();
    const [a, b, c] = [row("a"), row("b"), row("c")];
    for (const r of [a, b, c]) queue.add(r);
    queue.set(queue.next()!, "inflight");
    a.retiring = 0;
    queue.set(a, "pending");
    expect(queue.next()?.id).toBe("b"); // a waits for its retire
    queue.set(b, "inflight");
    delete a.retiring;
    queue.retireDone(a);
    expect(queue.next()?.id).toBe("a");
    queue.set(a, "inflight");
    expect(queue.next()?.id).toBe("c");
  });

  it("reads each row a bounded number of times however many rows there are (linear, not quadratic)", () => {
    // Every row is sent, fails once, waits for its retire, is sent again and finishes.
    const readsPerRow = (n: number) => {
      const queue = new RowQueue<ReturnType<typeof row>>();
      const rows = Array.from({ length: n }, (_, i) => row(`r${i}`));
      for (const r of rows) queue.add(r);
      const failedOnce = new Set<string>();
      for (let next = queue.next(); next; next = queue.next()) {
        queue.set(next, "inflight");
        if (!failedOnce.has(next.id)) {
          failedOnce.add(next.id);
          next.retiring = 0;
          queue.set(next, "pending");
          delete next.retiring;
          queue.retireDone(next);
        } else {
          queue.set(next, "done");
        }
      }
      expect(queue.counts).toEqual({ pending: 0, inflight: 0, done: n, failed: 0 });
      return rows.reduce((sum, r) => sum + r.reads, 0) / n;
    };
    expect(readsPerRow(100)).toBeLessThanOrEqual(10);
    expect(readsPerRow(5000)).toBe(readsPerRow(100));
  });
  it("sends a row a restore continues before rows never sent, once: its place in input order is skipped", () => {
    const queue = new RowQueue<ReturnType<typeof row>>();
    const rows = ["a", "b", "c", "d"].map((id) => row(id));
    for (const r of rows) queue.add(r);
    queue.sendFirst(rows[3]!); // d was restored: its episode waits parked
    const sent: string[] = [];
    for (let next = queue.next(); next; next = queue.next()) {
      sent.push(next.id);
      queue.set(next, "inflight");
    }
    expect(sent).toEqual(["d", "a", "b", "c"]);
  });

  it("gives a checkpoint its open rows (in flight, or restored and not sent) without reading any other row", () => {
    const queue = new RowQueue<ReturnType<typeof row>>();
    const rows = Array.from({ length: 10_000 }, (_, i) => row(`r${i}`, i % 2 ? "done" : "pending"));
    for (const r of rows) queue.add(r);
    const [sent, finished] = [queue.next()!, queue.next()!];
    queue.set(sent, "inflight");
    queue.set(finished, "inflight");
    queue.set(finished, "done");
    const restored = rows[100]!;
    queue.setRestored(restored, true);
    const restoredThenRun = rows[102]!;
    queue.setRestored(restoredThenRun, true);
    queue.setRestored(restoredThenRun, false);
    for (const r of rows) r.reads = 0;
    expect(queue.open().map((r) => r.id).sort()).toEqual([sent.id, restored.id].sort());
    // A walk of every row read 10,000 statuses per checkpoint.
    expect(rows.reduce((sum, r) => sum + r.reads, 0)).toBe(0);
  });
});
