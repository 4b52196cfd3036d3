import { closeSync, writeSync } from "node:fs";
import type * as fsPromises from "node:fs/promises";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CaptureLedger } from "../../../participants/kinds/model/index.js";
import { ledgerRow } from "./model-fixtures.js";

// A directory fsync (open(dir, "r") then sync) fails while `failDirSync` is set: a rewrite's rename is done by then.
let failDirSync = false;
vi.mock("node:fs/promises", async (importOriginal) => {
  const actual = await importOriginal<typeof fsPromises>();
  return {
    ...actual,
    open: async (...args: Parameters<typeof actual.open>) => {
      const handle = await actual.open(...args);
      if (!failDirSync || args[1] !== "r") return handle;
      const sync = () => Promise.reject(Object.assign(new Error("EIO: i/o error, fsync"), { code: "EIO", syscall: "fsync" }));
      return new Proxy(handle, { get: (target, prop) => (prop === "sync" ? sync : Reflect.get(target, prop, target)) });
    },
  };
});

let dir: string;
beforeEach(async () => {
  failDirSync = false;
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-repair-rewrite-"));
});
afterEach(async () => {
  failDirSync = false;
  await rm(dir, { recursive: true, force: true });
});

describe("capture ledger: a torn append's repair, then a rewrite whose directory fsync fails after the rename", () => {
  it("the next append does not cut (or pad) the new file at the old file's offset", async () => {
    let failNext = false;
    const ledger = new CaptureLedger(dir, 16, 256, {
      write: (fd, buffer, offset) => {
        if (!failNext) return writeSync(fd, buffer, offset);
        failNext = false;
        // Torn: all but the newline lands, then the descriptor is gone, so the cut-off fails too (repair set).
        writeSync(fd, buffer.subarray(offset, buffer.length - 1));
        closeSync(fd);
        throw Object.assign(new Error("EIO: i/o error, write"), { code: "EIO" });
      },
    });
    try {
      await ledger.append(ledgerRow("k", "mc-1"));
      await ledger.append(ledgerRow("k", "mc-2"));
      failNext = true;
      await expect(ledger.append(ledgerRow("k", "mc-x"))).rejects.toThrow(/EIO/);
      // An undelivered call's take-back: the file is rewritten without mc-1 (and the torn tail), renamed, but not synced.
      failDirSync = true;
      await expect(ledger.retract("k", "mc-1")).rejects.toThrow(/EIO/);
      failDirSync = false;
      await ledger.append(ledgerRow("k", "mc-3"));
      const text = await readFile(join(dir, "k.lineage.jsonl"), "utf8");
      // Before: the new, shorter file was extended with zero bytes to the old offset, gluing them to mc-3's line.
      expect(text).not.toContain("\0");
      expect(text.split("\n").filter(Boolean).map((l) => JSON.parse(l).model_call_id)).toEqual(["mc-2", "mc-3"]);
      expect((await ledger.rows("k")).map((r) => r.model_call_id)).toEqual(["mc-2", "mc-3"]);
    } finally {
      await ledger.close();
    }
  });
});
