import { existsSync, fdatasync, writeSync } from "node:fs";
import * as fsPromises from "node:fs/promises";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CHAT, chat, ledgerRow, modelFixture, settle, type ModelFixture } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";
import { waitUntil } from "../../support/wait-until.js";

// The unlink of a ledger file waits while `gate` is set: the after-commit hook's removal is then
// under way (past its "does a call keep it?" check) for as long as the test says. A gate that
// `fails` makes its first unlink fail (EIO) once released; later ones go through.
let gate: { key: string; reached: boolean; open: Promise<void>; release: () => void; fails: boolean; failed: boolean } | undefined;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  return withOverrides(actual, {
    unlink: async (path: Parameters<typeof actual.unlink>[0]) => {
      if (gate && !gate.failed && String(path).endsWith(`/${gate.key}.lineage.jsonl`)) {
        gate.reached = true;
        await gate.open;
        if (gate.fails) {
          gate.failed = true;
          throw Object.assign(new Error(`EIO: i/o error, unlink '${String(path)}'`), { code: "EIO", syscall: "unlink", path: String(path) });
        }
      }
      return actual.unlink(path);
    },
  });
});

function gateUnlinkOf(key: string, fails = false): NonNullable<typeof gate> {
  let release!: () => void;
  const open = new Promise<void>((resolve) => (release = resolve));
  gate = { key, reached: false, open, release, fails, failed: false };
  return gate;
}

let f: ModelFixture;
beforeEach(async () => {
  gate = undefined;
  f = await modelFixture();
});
afterEach(async () => {
  gate?.release();
  gate = undefined;
  await f.close();
});

describe("afterCommit freeing a restored ledger while a call of its key is admitted", () => {
  it("a call arriving while the removal is under way starts after it, from no rows: never the parent of a row being deleted", async () => {
    await f.kind.install([{ episode_id: ep("a"), rows: [ledgerRow("a", "mc-restored")], generation_cuts: [] }], {});
    const unlink = gateUnlinkOf("a-a1");
    const hook = f.kind.afterCommit([ep("other")]); // a-a1 is left out: freed
    await waitUntil(() => unlink.reached, "the clean-up's unlink of a-a1 reached");
    const admitted = f.kind.admit("a-a1", CHAT, chat("start over"));
    await settle();
    unlink.release();
    await hook;
    const ticket = await admitted;
    // Before: parent mc-restored, read from the rows the hook then deleted.
    expect(ticket.parentCallId).toBeNull();
    await f.kind.responseStart(ticket);
    await f.kind.complete(ticket, { stagingKey: null, usage: null });
    expect((await f.kind.ledger.rows("a-a1")).map((r) => [r.model_call_id, r.parent_call_id])).toEqual([[ticket.modelCallId, null]]);
  });

  it("a call being admitted when the removal would start keeps the ledger, and continues its last row", async () => {
    await f.kind.install([{ episode_id: ep("a"), rows: [ledgerRow("a", "mc-restored")], generation_cuts: [] }], {});
    f.kind.ledger.evict("a"); // its rows are read from the file, under the stripe lock
    let release!: () => void;
    const held = f.kind.ledger.locks.run("a-a1", () => new Promise<void>((resolve) => (release = resolve)));
    const admitted = f.kind.admit("a-a1", CHAT, chat("start over")); // waits for the stripe to read the rows
    const hook = f.kind.afterCommit([ep("other")]); // its removal queues behind that read
    await settle();
    release();
    await held;
    await hook;
    const ticket = await admitted;
    expect(ticket.parentCallId).toBe("mc-restored");
    await f.kind.responseStart(ticket);
    await f.kind.complete(ticket, { stagingKey: null, usage: null });
    expect((await f.kind.ledger.rows("a-a1")).map((r) => r.model_call_id)).toEqual(["mc-restored", ticket.modelCallId]);
  });
});

describe("afterCommit freeing a restored ledger while a call of its key waits out a ledger outage", () => {
  it("the call waiting for the ledger's storage to be tried again counts as being admitted: the ledger stays, and it continues its last row", async () => {
    await f.close();
    const disk = { full: false, syncGate: undefined as Promise<void> | undefined, syncReached: false };
    f = await modelFixture({
      ledger: {
        ledgerProbeIntervalMs: 0,
        ledgerWrite: (fd, buffer, offset) => {
          if (disk.full) throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", syscall: "write" });
          return writeSync(fd, buffer, offset);
        },
        ledgerSync: async (fd) => {
          if (disk.syncGate) {
            disk.syncReached = true;
            await disk.syncGate;
          }
          await promisify(fdatasync)(fd);
        },
      },
    });
    await f.kind.install([{ episode_id: ep("a"), rows: [ledgerRow("a", "mc-restored")], generation_cuts: [] }], {});
    // Another call's row meets the full disk: the outage begins.
    disk.full = true;
    const failing = await f.kind.admit("b", CHAT, chat("hi"));
    await f.kind.responseStart(failing);
    await expect(f.kind.complete(failing, { stagingKey: null, usage: null })).rejects.toMatchObject({ code: "ENOSPC" });
    // Room again: a call of the restored key waits while the storage is tried (its probe's sync held).
    disk.full = false;
    let release!: () => void;
    disk.syncGate = new Promise<void>((resolve) => (release = resolve));
    const admitted = f.kind.admit("a-a1", CHAT, chat("start over"));
    // The probe opens its file in the thread pool: real time, not a few turns of the event loop.
    await waitUntil(() => disk.syncReached, "the probe's sync", 10_000);
    await f.kind.afterCommit([ep("other")]); // a-a1 left out: freed, unless a call of it is being admitted
    disk.syncGate = undefined;
    release();
    const ticket = await admitted;
    // Before: null, the restored lineage deleted while the call waited for the probe.
    expect(ticket.parentCallId).toBe("mc-restored");
  });
});

/** Installs a-a1 as a restored ledger and starts a commit's clean-up that frees it, its unlink held. */
async function freeingHeld() {
  await f.kind.install([{ episode_id: ep("a"), rows: [ledgerRow("a", "mc-restored")], generation_cuts: [] }], {});
  const unlink = gateUnlinkOf("a-a1", true);
  const hook = f.kind.afterCommit([ep("other")]);
  await waitUntil(() => unlink.reached, "the clean-up's unlink of a-a1 reached");
  return { unlink, hook };
}

describe("a commit's clean-up whose free fails after a retire or forget dropped that restored ledger", () => {
  it("a retire meanwhile: the ledger is gone when it replies, and no restored state of it comes back", async () => {
    const { unlink, hook } = await freeingHeld();
    const retired = f.kind.retire([ep("a", 1)]);
    await settle();
    unlink.release();
    await expect(hook).rejects.toMatchObject({ code: "EIO" });
    await retired;
    expect(existsSync(join(f.dir, "ledger", "a-a1.lineage.jsonl"))).toBe(false);
    // Before: a-a1 went back into the restored keys, live state of a retired attempt (a restore refused as not fresh).
    expect(f.kind.hasLiveState()).toBe(false);
  });

  it("a forget meanwhile: its restored state stays forgotten (its file stays, as a forget leaves files)", async () => {
    const { unlink, hook } = await freeingHeld();
    await f.kind.forget(["a"]);
    unlink.release();
    await expect(hook).rejects.toMatchObject({ code: "EIO" });
    expect(f.kind.hasLiveState()).toBe(false);
  });
});
