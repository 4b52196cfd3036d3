import { readdir } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { RolloutRecordsSink } from "../../../coordinator/collect/rollout-records-sink.js";
import type { TraceRecord } from "../../../protocol/index.js";
import { waitUntil } from "../../support/wait-until.js";
import { linearTrace, silent, tempDir, traceId } from "../replay/fixtures.js";

/**
 * abandon(): the exit went on without the final flush (its storage hangs; the collector waited
 * --run-timeout-s), counted what was not written, and let go of the lock. From then on the sink
 * must touch nothing more (no sync of --out, no step, no marker, no retry), a second close() must
 * not wait again, and what it counts unwritten must be exactly the records not published.
 *
 * `disk.hangIndex` holds the index write that follows a linked record file for good (a records
 * directory on a mount that stops answering after the link).
 */
const disk = vi.hoisted(() => ({ hangIndex: false, indexWrites: 0 }));

vi.mock("../../../coordinator/publication/durable-fs.js", async (importOriginal) => {
  const real = await importOriginal<typeof import("../../../coordinator/publication/durable-fs.js")>();
  const replaceFileDurably: typeof real.replaceFileDurably = async (...args) => {
    if (String(args[0]).includes("index_") && disk.hangIndex) {
      disk.indexWrites++;
      return new Promise<never>(() => undefined);
    }
    return real.replaceFileDurably(...args);
  };
  return { ...real, replaceFileDurably };
});

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => {
  ({ dir, cleanup } = await tempDir());
  Object.assign(disk, { hangIndex: false, indexWrites: 0 });
});
afterEach(() => cleanup());

const options = () => ({ dir, env: "gym", kind: "eval" as const, everyRows: 100, everySeconds: 600 });

/** A beforePublish (the collector's sync of --out) whose first call waits for the test; the calls made. */
function heldSync(): { beforePublish: (records: TraceRecord[]) => Promise<TraceRecord[]>; calls: () => number; fail: () => void } {
  let calls = 0;
  let fail!: () => void;
  const first = new Promise<never>((_, reject) => (fail = () => reject(Object.assign(new Error("EIO: i/o error, open"), { code: "EIO" }))));
  first.catch(() => undefined);
  return {
    beforePublish: async (records) => {
      calls++;
      if (calls === 1) await first;
      return records;
    },
    calls: () => calls,
    fail,
  };
}

describe("an abandoned rollout-records sink", () => {
  it("syncs --out no more and retries nothing when the sync under way at the abandon fails after it", async () => {
    const sync = heldSync();
    const sink = new RolloutRecordsSink(options(), silent, sync.beforePublish);
    await sink.start();
    sink.add(linearTrace(traceId(1)));
    const closing = sink.close();
    await waitUntil(() => sync.calls() === 1, "the final flush's sync");
    sink.abandon();
    expect(sink.stats.unwritten).toBe(1);
    // The mount answers at last, refusing the sync: the records go back to the buffer.
    sync.fail();
    await closing;
    // The exit went on (the lock let go): no second sync of --out, no step published.
    expect(sync.calls()).toBe(1);
    expect(await readdir(path.join(dir, "rollouts"))).toEqual([]);
    expect(sink.stats).toMatchObject({ steps: 0, records: 0, unwritten: 1 });
  });

  it("a close() after the abandon returns at once, not waiting for the flush that hangs a second time", { timeout: 5_000 }, async () => {
    const sync = heldSync();
    const sink = new RolloutRecordsSink(options(), silent, sync.beforePublish);
    await sink.start();
    sink.add(linearTrace(traceId(1)));
    void sink.close();
    await waitUntil(() => sync.calls() === 1, "the final flush's sync");
    sink.abandon();
    try {
      const outcome = await Promise.race([sink.close().then(() => "closed"), new Promise((resolve) => setTimeout(() => resolve("still waiting"), 1_000))]);
      expect(outcome).toBe("closed");
      expect(sink.stats.unwritten).toBe(1);
    } finally {
      sync.fail();
    }
  });

  it("does not count records whose file was published before the abandon as unwritten (the index after it hangs)", async () => {
    const sink = new RolloutRecordsSink(options(), silent, async (records) => records);
    await sink.start();
    disk.hangIndex = true;
    sink.add(linearTrace(traceId(1)));
    sink.add(linearTrace(traceId(2)));
    void sink.close();
    await waitUntil(() => disk.indexWrites === 1, "the index write after the record file's link");
    sink.abandon();
    // Both records are in step_1's record file (linked); the next start completes its marker.
    expect(await readdir(path.join(dir, "rollouts", "step_1"))).toContain("eval_rollouts_gym.jsonl");
    expect(sink.stats.unwritten).toBe(0);
  });
});
