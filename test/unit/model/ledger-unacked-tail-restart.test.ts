import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CaptureLedger } from "../../../participants/kinds/model/index.js";
import { ledgerRow, tornWrites } from "./model-fixtures.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-tail-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const row = ledgerRow;
const ids = async (ledger: CaptureLedger, key: string) => (await ledger.rows(key)).map((r) => r.model_call_id);
const fileIds = async (key: string) =>
  (await readFile(join(dir, `${key}.lineage.jsonl`), "utf8"))
    .split("\n")
    .filter(Boolean)
    .map((l) => JSON.parse(l).model_call_id);

// An append is acknowledged only once its whole line, newline included, is durable: a last line
// without its newline was never acknowledged (its call was cut off or never delivered), even when
// its JSON happens to be a complete row.
describe("capture ledger: a last line without its newline, after a restart", () => {
  it("a failed write that could not be cut off is not read back as a row by the next process", async () => {
    const torn = tornWrites();
    const ledger = new CaptureLedger(dir, 16, 256, { write: torn.write });
    await ledger.append(row("eio", "mc-1"));
    torn.tearNext();
    await expect(ledger.append(row("eio", "mc-2"))).rejects.toThrow(/EIO/);
    await ledger.close();
    // The repair offset was this process's: the restarted one finds the fragment at the file's end.
    const restarted = new CaptureLedger(dir);
    try {
      expect(await ids(restarted, "eio")).toEqual(["mc-1"]);
      await restarted.append(row("eio", "mc-3"));
      expect(await fileIds("eio")).toEqual(["mc-1", "mc-3"]);
    } finally {
      await restarted.close();
    }
  });

  it("a crash that persisted all of a row but its newline leaves no row of it", async () => {
    await writeFile(join(dir, "nonl.lineage.jsonl"), `${JSON.stringify(row("nonl", "mc-1"))}\n${JSON.stringify(row("nonl", "mc-2"))}`);
    const ledger = new CaptureLedger(dir);
    try {
      expect(await ids(ledger, "nonl")).toEqual(["mc-1"]);
      await ledger.append(row("nonl", "mc-3"));
      expect(await fileIds("nonl")).toEqual(["mc-1", "mc-3"]);
    } finally {
      await ledger.close();
    }
  });
});
