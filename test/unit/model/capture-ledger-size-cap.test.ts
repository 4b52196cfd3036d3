import { mkdtemp, readFile, rm, stat, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CaptureLedger } from "../../../participants/kinds/model/index.js";
import { ledgerRow } from "./model-fixtures.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-cap-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

const line = (key: string, id: string) => `${JSON.stringify(ledgerRow(key, id))}\n`;

describe("capture ledger: a file larger than one key's ledger can be", () => {
  it("is refused payload_too_large before a byte is read, and left as it is (a sparse 3 GiB file: Node's readFile threw RangeError)", async () => {
    const path = join(dir, "huge.lineage.jsonl");
    await writeFile(path, line("huge", "mc-1"));
    await truncate(path, 3 * 2 ** 30); // sparse: nothing written to disk
    const ledger = new CaptureLedger(dir);
    try {
      await expect(ledger.rows("huge")).rejects.toMatchObject({ code: "payload_too_large", message: expect.stringContaining("over the 268435456-byte limit") });
      await expect(ledger.retract("huge", "mc-1")).rejects.toMatchObject({ code: "payload_too_large" });
      expect((await stat(path)).size).toBe(3 * 2 ** 30);
    } finally {
      await ledger.close();
    }
  });

  it("is refused at the limit given (maxFileBytes), and a file within it loads and retracts as before", async () => {
    const path = join(dir, "k.lineage.jsonl");
    const text = line("k", "mc-1") + "\n" + line("k", "mc-2") + line("k", "mc-3");
    await writeFile(path, text);
    const tight = new CaptureLedger(dir, 16, 256, { maxFileBytes: text.length - 1 });
    try {
      await expect(tight.rows("k")).rejects.toMatchObject({ code: "payload_too_large", message: expect.stringContaining(`is ${text.length} bytes, over the ${text.length - 1}-byte limit`) });
    } finally {
      await tight.close();
    }
    const ledger = new CaptureLedger(dir, 16, 256, { maxFileBytes: text.length });
    try {
      expect((await ledger.rows("k")).map((r) => r.model_call_id)).toEqual(["mc-1", "mc-2", "mc-3"]);
      expect(await ledger.retract("k", "mc-2")).toBe(true);
      expect(await readFile(path, "utf8")).toBe(line("k", "mc-1") + "\n" + line("k", "mc-3"));
      expect(await ledger.retract("k", "mc-3")).toBe(true);
      expect(await readFile(path, "utf8")).toBe(line("k", "mc-1") + "\n");
    } finally {
      await ledger.close();
    }
  });
});
