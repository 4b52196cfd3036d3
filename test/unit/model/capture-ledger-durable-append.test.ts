import { fdatasync } from "node:fs";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CaptureLedger } from "../../../participants/kinds/model/index.js";
import { ledgerRow } from "./model-fixtures.js";

// An append ends a call's response (the proxy sends its last bytes once it resolves): the caller
// then holds a complete answer, and a restarted proxy continues the key from the file. A row only
// in the page cache is lost with a power loss or kernel crash, and the restarted proxy would give
// the caller's next call an older parent and export a lineage missing a delivered call. So the
// append resolves only once the row's descriptor was synced.

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-durable-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const row = ledgerRow;

const realSync = promisify(fdatasync);

/** A sync seam whose syncs wait until released (once `passThrough()` was called, they no longer wait); counts the syncs started. */
function heldSyncs() {
  const waiting: { fd: number; release: (error?: Error) => void }[] = [];
  const wakers: (() => void)[] = [];
  let started = 0;
  let through = false;
  const sync = (fd: number) => {
    started += 1;
    if (through) return realSync(fd);
    return new Promise<void>((resolve, reject) => {
      waiting.push({ fd, release: (error) => (error ? reject(error) : realSync(fd).then(resolve, reject)) });
      for (const wake of wakers.splice(0)) wake();
    });
  };
  /** The oldest sync waiting, once one is (an event, not a poll: the append's open runs in the thread pool). */
  const next = async () => {
    while (waiting.length === 0) await new Promise<void>((resolve) => wakers.push(resolve));
    return waiting.shift()!;
  };
  /** Ends the test: every sync waiting or still to come goes ahead. */
  const passThrough = () => {
    through = true;
    for (const w of waiting.splice(0)) w.release();
  };
  return { sync, waiting, next, passThrough, started: () => started };
}

async function settledWithin<T>(promise: Promise<T>, turns = 50): Promise<boolean> {
  let done = false;
  void promise.then(
    () => (done = true),
    () => (done = true),
  );
  for (let i = 0; i < turns && !done; i++) await new Promise((resolve) => setImmediate(resolve));
  return done;
}

describe("capture ledger: an append is acknowledged only once its row is durable", () => {
  it("does not resolve (first append of a key, or one on its open descriptor) before the row's sync ended", async () => {
    const syncs = heldSyncs();
    const ledger = new CaptureLedger(dir, 16, 256, { sync: syncs.sync });
    try {
      const first = ledger.append(row("r1", "mc-1"));
      expect(await settledWithin(first)).toBe(false);
      (await syncs.next()).release();
      await first;
      // The key's descriptor is open now: the immediate path must wait for the sync as well.
      const second = ledger.append(row("r1", "mc-2"));
      expect(await settledWithin(second)).toBe(false);
      (await syncs.next()).release();
      await second;
      expect(syncs.started()).toBe(2);
    } finally {
      syncs.passThrough();
      await ledger.close();
    }
  });

  it("a failed sync rejects the append and takes the row back (file and memory), so the caller's call fails as a whole", async () => {
    const syncs = heldSyncs();
    const ledger = new CaptureLedger(dir, 16, 256, { sync: syncs.sync });
    try {
      const ok = ledger.append(row("r1", "mc-1"));
      (await syncs.next()).release();
      await ok;
      const failing = ledger.append(row("r1", "mc-2"));
      expect(await settledWithin(failing)).toBe(false);
      (await syncs.next()).release(Object.assign(new Error("EIO: i/o error, fdatasync"), { code: "EIO", syscall: "fdatasync" }));
      await expect(failing).rejects.toMatchObject({ code: "EIO", path: join(dir, "r1.lineage.jsonl") });
      expect((await ledger.rows("r1")).map((r) => r.model_call_id)).toEqual(["mc-1"]);
      const file = (await readFile(join(dir, "r1.lineage.jsonl"), "utf8")).split("\n").filter(Boolean);
      expect(file.map((l) => JSON.parse(l).model_call_id)).toEqual(["mc-1"]);
    } finally {
      syncs.passThrough();
      await ledger.close();
    }
  });

  it("appends of one key arriving while its sync runs share the next one (no sync per append under load)", async () => {
    const syncs = heldSyncs();
    const ledger = new CaptureLedger(dir, 16, 256, { sync: syncs.sync });
    try {
      const first = ledger.append(row("r1", "mc-1"));
      const firstSync = await syncs.next();
      const more = [2, 3, 4, 5].map((n) => ledger.append(row("r1", `mc-${n}`)));
      expect(await settledWithin(Promise.all(more))).toBe(false);
      firstSync.release();
      await first;
      // One sync, queued behind the first, for the four appends written meanwhile.
      (await syncs.next()).release();
      await Promise.all(more);
      expect(syncs.started()).toBe(2);
      expect((await ledger.rows("r1")).map((r) => r.model_call_id)).toEqual(["mc-1", "mc-2", "mc-3", "mc-4", "mc-5"]);
    } finally {
      syncs.passThrough();
      await ledger.close();
    }
  });

  it("a rewrite of the key while its sync runs does not close the descriptor under it", async () => {
    const syncs = heldSyncs();
    const ledger = new CaptureLedger(dir, 16, 256, { sync: syncs.sync });
    try {
      const first = ledger.append(row("r1", "mc-1"));
      (await syncs.next()).release();
      await first;
      const second = ledger.append(row("r1", "mc-2"));
      const held = await syncs.next();
      // A replace (restore's import) drops the key's descriptor while the append's sync waits.
      await ledger.replace("r1", [row("r1", "mc-0")]);
      held.release(); // the real fdatasync on the same descriptor: not EBADF
      await second;
    } finally {
      syncs.passThrough();
      await ledger.close();
    }
  });
});
