import { fdatasync } from "node:fs";
import type * as fsPromises from "node:fs/promises";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CaptureLedger } from "../../../participants/kinds/model/index.js";
import { ledgerRow, tornWrites } from "./model-fixtures.js";

// A rewrite (replace, retract) renames its temp file over the key's, then fsyncs the directory.
// When only that fsync fails (EIO), the file already holds the new rows: memory must not keep the old.
let failDirSync = false;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  return withOverrides(actual, {
    open: async (...args: Parameters<typeof actual.open>) => {
      const handle = await actual.open(...args);
      if (!failDirSync || args[1] !== "r") return handle;
      const sync = () => Promise.reject(Object.assign(new Error("EIO: i/o error, fsync"), { code: "EIO", syscall: "fsync" }));
      return handleWith(handle, { sync });
    },
  });
});

const realSync = promisify(fdatasync);
let dir: string;
beforeEach(async () => {
  failDirSync = false;
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-rewrite-"));
});
afterEach(async () => {
  failDirSync = false;
  await rm(dir, { recursive: true, force: true });
});

const fileCalls = async (key: string) =>
  (await readFile(join(dir, `${key}.lineage.jsonl`), "utf8"))
    .split("\n")
    .filter(Boolean)
    .map((line) => (JSON.parse(line) as { model_call_id: string }).model_call_id);
const memoryCalls = async (ledger: CaptureLedger, key: string) => (await ledger.rows(key)).map((r) => r.model_call_id);

describe("capture ledger: a rewrite whose directory fsync fails after the rename", () => {
  it("a failed append's take-back leaves no row in memory that the file no longer holds", async () => {
    let failSync = false;
    const ledger = new CaptureLedger(dir, 16, 256, {
      sync: (fd) => (failSync ? Promise.reject(Object.assign(new Error("EIO: i/o error, fdatasync"), { code: "EIO" })) : realSync(fd)),
    });
    try {
      await ledger.append(ledgerRow("r1", "mc-1"));
      expect(await memoryCalls(ledger, "r1")).toEqual(["mc-1"]);
      failSync = true;
      failDirSync = true;
      await expect(ledger.append(ledgerRow("r1", "mc-2"))).rejects.toThrow(/EIO/);
      failSync = false;
      failDirSync = false;
      expect(await fileCalls("r1")).toEqual(["mc-1"]);
      expect(await memoryCalls(ledger, "r1")).toEqual(["mc-1"]);
    } finally {
      await ledger.close();
    }
  });

  it("a failed replace leaves memory as the file is", async () => {
    const ledger = new CaptureLedger(dir, 16, 256);
    try {
      await ledger.replace("r2", [ledgerRow("r2", "mc-a")]);
      expect(await memoryCalls(ledger, "r2")).toEqual(["mc-a"]);
      failDirSync = true;
      await expect(ledger.replace("r2", [ledgerRow("r2", "mc-b")])).rejects.toThrow(/EIO/);
      failDirSync = false;
      expect(await memoryCalls(ledger, "r2")).toEqual(await fileCalls("r2"));
    } finally {
      await ledger.close();
    }
  });

  it("a failed replace of a key not on disk yet still knows the file it created", async () => {
    const ledger = new CaptureLedger(dir, 16, 256);
    try {
      failDirSync = true;
      await expect(ledger.replace("r3", [ledgerRow("r3", "mc-x")])).rejects.toThrow(/EIO/);
      failDirSync = false;
      expect(await fileCalls("r3")).toEqual(["mc-x"]);
      expect(await memoryCalls(ledger, "r3")).toEqual(["mc-x"]);
    } finally {
      await ledger.close();
    }
  });

  it("after a torn append whose cut-off failed too (a repair offset), the next append does not cut (or pad) the new file at the old file's offset", async () => {
    const torn = tornWrites();
    const ledger = new CaptureLedger(dir, 16, 256, { write: torn.write });
    try {
      await ledger.append(ledgerRow("k", "mc-1"));
      await ledger.append(ledgerRow("k", "mc-2"));
      torn.tearNext();
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
