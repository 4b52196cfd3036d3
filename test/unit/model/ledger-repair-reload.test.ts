import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CaptureLedger } from "../../../participants/kinds/model/index.js";
import { ledgerRow, tornWrites } from "./model-fixtures.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-repair-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const row = ledgerRow;

describe("capture ledger: a failed write that could not be cut off", () => {
  it("is not read back as a row when its key is loaded again before the next append", async () => {
    const torn = tornWrites();
    const ledger = new CaptureLedger(dir, 16, 256, { maxCachedRows: 1, write: torn.write });
    try {
      await ledger.rows("eio");
      await ledger.append(row("eio", "mc-1"));
      torn.tearNext();
      await expect(ledger.append(row("eio", "mc-2"))).rejects.toThrow(/EIO/);
      // Another rollout's rows push "eio" out of the bounded in-memory copy.
      await ledger.append(row("other", "mc-o"));
      await ledger.rows("other");
      expect(ledger.cacheSize().keys).toBe(1);
      // Loaded again from its file: the failed call's row must not come back (its caller was cut off).
      expect((await ledger.rows("eio")).map((r) => r.model_call_id)).toEqual(["mc-1"]);
      await ledger.append(row("eio", "mc-3"));
      expect((await ledger.rows("eio")).map((r) => r.model_call_id)).toEqual(["mc-1", "mc-3"]);
      const file = (await readFile(join(dir, "eio.lineage.jsonl"), "utf8")).split("\n").filter(Boolean);
      expect(file.map((l) => JSON.parse(l).model_call_id)).toEqual(["mc-1", "mc-3"]);
    } finally {
      await ledger.close();
    }
  });
});
