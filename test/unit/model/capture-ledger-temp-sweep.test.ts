import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CaptureLedger } from "../../../participants/kinds/model/index.js";
import { ledgerRow } from "./model-fixtures.js";
import { waitUntil } from "../../support/wait-until.js";

let dir: string;
beforeEach(async () => {
  dir = join(await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-temp-")), "ledger");
  await mkdir(dir, { mode: 0o700 });
});
afterEach(async () => {
  await rm(join(dir, ".."), { recursive: true, force: true });
});

/** A rewrite temp file as writeFileAtomic names it, left by a writer that never renamed it. */
const tempOf = (key: string, pid: number) => `.${key}.lineage.jsonl.${pid}.0123456789ab.tmp`;

describe("rewrite temp files a crash left in the ledger directory", () => {
  it("are removed once the opening ledger holds their key's stripe, whatever pid they name; other files stay", async () => {
    await writeFile(join(dir, "a.lineage.jsonl"), `${JSON.stringify(ledgerRow("a", "mc-1"))}\n`);
    // A dead process's, and one naming this very pid (a restarted container is PID 1 again).
    await writeFile(join(dir, tempOf("a", 999_999_999)), "torn");
    await writeFile(join(dir, tempOf("b", process.pid)), "torn");
    await writeFile(join(dir, ".unrelated.tmp"), "kept");
    const ledger = new CaptureLedger(dir);
    expect((await ledger.rows("a")).map((r) => r.model_call_id)).toEqual(["mc-1"]);
    await ledger.close();
    expect((await readdir(dir)).sort()).toEqual([".unrelated.tmp", "a.lineage.jsonl", "locks"]);
  });

  it("are kept while another live ledger on the directory holds their key's stripe", async () => {
    const holder = new CaptureLedger(dir);
    let release!: () => void;
    let entered!: () => void;
    const inside = new Promise<void>((resolve) => (entered = resolve));
    const held = holder.locks.run("a", () => {
      entered();
      return new Promise<void>((resolve) => (release = resolve));
    });
    await inside;
    // Its rewrite of "a" is in progress: the temp file is live.
    await writeFile(join(dir, tempOf("a", process.pid)), "in progress");
    const opener = new CaptureLedger(dir);
    // Its sweep is trying the stripe once its owner file is written beside the holder's.
    const owners = async () => (await readdir(join(dir, "locks"))).filter((name) => name.startsWith(".owner-")).length;
    await waitUntil(async () => (await owners()) === 2, "the opener's owner file beside the holder's");
    expect(await readdir(dir)).toContain(tempOf("a", process.pid));
    // The holder's rewrite ends (a crash would leave the file): once the stripe is free the opener takes it.
    release();
    await held;
    await holder.close();
    await opener.close();
    expect(await readdir(dir)).not.toContain(tempOf("a", process.pid));
  });
});
