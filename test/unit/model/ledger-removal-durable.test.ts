import type * as fsPromises from "node:fs/promises";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CaptureLedger } from "../../../participants/kinds/model/index.js";
import { deliveredCall, ledgerRow, modelFixture } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";

// What reached the file system, in order: unlinks of ledger files and fsyncs of directories.
const events: string[] = [];
vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  return withOverrides(actual, {
    unlink: async (...args: Parameters<typeof actual.unlink>) => {
      await actual.unlink(...args);
      if (String(args[0]).endsWith(".lineage.jsonl")) events.push(`unlink ${String(args[0])}`);
    },
    open: async (...args: Parameters<typeof actual.open>) => {
      const handle = await actual.open(...args);
      if (args[1] !== "r") return handle;
      const sync = async () => {
        await handle.sync();
        events.push(`fsync ${String(args[0])}`);
      };
      return handleWith(handle, { sync });
    },
  });
});

let dir: string;
beforeEach(async () => {
  events.length = 0;
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-removal-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

// A removal (retire, restore's free of the source attempts, after-commit free, the ledger API's
// DELETE) answers once its unlinks are durable: without the directory's fsync a power loss brings
// the file back, and a later call of that key continues rows the protocol freed.
describe("capture ledger: a removal", () => {
  it("fsyncs the ledger directory after its unlinks, before it resolves", async () => {
    const ledger = new CaptureLedger(dir);
    try {
      await ledger.append(ledgerRow("gone", "mc-1"));
      await ledger.append(ledgerRow("gone-a1", "mc-2"));
      events.length = 0;
      await ledger.remove(["gone", "gone-a1"]);
      const lastUnlink = Math.max(events.indexOf(`unlink ${join(dir, "gone.lineage.jsonl")}`), events.indexOf(`unlink ${join(dir, "gone-a1.lineage.jsonl")}`));
      expect(lastUnlink).toBeGreaterThanOrEqual(0);
      expect(events.slice(lastUnlink + 1)).toContain(`fsync ${dir}`);
    } finally {
      await ledger.close();
    }
  });

  it("a removal whose every key is kept (or has no file) fsyncs nothing", async () => {
    const ledger = new CaptureLedger(dir);
    try {
      await ledger.append(ledgerRow("kept", "mc-1"));
      events.length = 0;
      await ledger.remove(["kept"], () => true);
      expect(events).toEqual([]);
    } finally {
      await ledger.close();
    }
  });
});

// The model kind's removals of many keys (a retire, a restore's install, the after-commit free) share
// one directory fsync, after their last unlink: one each would cost milliseconds per episode.
describe("model kind: removals of many episodes", () => {
  const unlinksThenOneSync = (ledgerDir: string) => {
    const first = events.findIndex((e) => e.startsWith("unlink "));
    const last = events.findLastIndex((e) => e.startsWith("unlink "));
    expect(first).toBeGreaterThanOrEqual(0);
    return { syncsAfter: events.slice(last + 1).filter((e) => e === `fsync ${ledgerDir}`).length, syncsBetween: events.slice(first, last).filter((e) => e === `fsync ${ledgerDir}`).length };
  };

  it("a retire of three episodes unlinks their ledgers, then fsyncs the directory once", async () => {
    const f = await modelFixture();
    try {
      for (const key of ["r0", "r1", "r2"]) await deliveredCall(f.kind, key);
      events.length = 0;
      await f.kind.retire([ep("r0"), ep("r1"), ep("r2")]);
      expect(events.filter((e) => e.startsWith("unlink "))).toHaveLength(3);
      expect(unlinksThenOneSync(join(f.dir, "ledger"))).toEqual({ syncsAfter: 1, syncsBetween: 0 });
    } finally {
      await f.close();
    }
  });

  it("an install's removals of the source attempts are durable when it resolves", async () => {
    const f = await modelFixture();
    try {
      // The sources' ledgers, as a process that served them on this directory left them.
      for (const key of ["s0", "s1"]) await f.kind.ledger.append(ledgerRow(key, `mc-${key}`));
      events.length = 0;
      await f.kind.install(["s0", "s1"].map((k) => ({ episode_id: ep(k), rows: [ledgerRow(k, `mc-${k}`)], generation_cuts: [] })), {});
      const unlinked = events.filter((e) => e.startsWith("unlink ")).map((e) => e.split("/").pop());
      expect(unlinked).toEqual(["s0.lineage.jsonl", "s1.lineage.jsonl"]);
      const lastUnlink = events.findLastIndex((e) => e.startsWith("unlink "));
      expect(events.slice(lastUnlink + 1)).toContain(`fsync ${join(f.dir, "ledger")}`);
    } finally {
      await f.close();
    }
  });

  it("the after-commit free of restored ledgers left out of the scope fsyncs the directory once, after its unlinks", async () => {
    const f = await modelFixture();
    try {
      await f.kind.install(["a", "b", "c"].map((k) => ({ episode_id: ep(k), rows: [ledgerRow(k, `mc-${k}`)], generation_cuts: [] })), {});
      events.length = 0;
      await f.kind.afterCommit([ep("other")]);
      expect(events.filter((e) => e.startsWith("unlink "))).toHaveLength(3);
      expect(unlinksThenOneSync(join(f.dir, "ledger"))).toEqual({ syncsAfter: 1, syncsBetween: 0 });
    } finally {
      await f.close();
    }
  });
});
