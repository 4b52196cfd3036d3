import { existsSync } from "node:fs";
import * as fsPromises from "node:fs/promises";
import { readFile } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { deliveredCall, ledgerRow, modelFixture, type ModelFixture } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";

// Removing a ledger file fails while `failUnlink` names its key (an I/O error, a read-only remount):
// root removes anything, so `unlink` is wrapped.
let failUnlink: string | undefined;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  return withOverrides(actual, {
    unlink: (path: Parameters<typeof actual.unlink>[0]) =>
      failUnlink !== undefined && String(path).endsWith(`/${failUnlink}.lineage.jsonl`)
        ? Promise.reject(Object.assign(new Error(`EIO: i/o error, unlink '${String(path)}'`), { code: "EIO", syscall: "unlink", path: String(path) }))
        : actual.unlink(path),
  });
});

let f: ModelFixture;
beforeEach(async () => {
  failUnlink = undefined;
  f = await modelFixture();
});
afterEach(async () => {
  failUnlink = undefined;
  await f.close();
});

const ledgerFile = (key: string) => join(f.dir, "ledger", `${key}.lineage.jsonl`);
const fileCalls = async (key: string) =>
  (await readFile(ledgerFile(key), "utf8"))
    .split("\n")
    .filter(Boolean)
    .map((line) => (JSON.parse(line) as { model_call_id: string }).model_call_id);

describe("a ledger whose file cannot be removed", () => {
  it("a retire whose unlink fails keeps the key known: its rows still match the file, and the retried retire removes it", async () => {
    const a = await deliveredCall(f.kind, "rm1");
    failUnlink = "rm1";
    await expect(f.kind.retire([ep("rm1", 0)])).rejects.toMatchObject({ code: "EIO" });
    failUnlink = undefined;

    // Nothing was removed: memory and file agree.
    expect(await fileCalls("rm1")).toEqual([a.modelCallId]);
    expect((await f.kind.ledger.rows("rm1")).map((r) => r.model_call_id)).toEqual([a.modelCallId]);
    expect((await f.kind.ledger.keysOfRollout("rm1")).map((k) => k.key)).toEqual(["rm1"]);

    // The retried retire (the coordinator's, or the operator's) removes the file.
    await f.kind.retire([ep("rm1", 0)]);
    expect(existsSync(ledgerFile("rm1"))).toBe(false);
  });

  it("a ledger delete whose unlink fails does not leave a file the next call appends to behind an empty in-memory ledger", async () => {
    const a = await deliveredCall(f.kind, "rm2");
    failUnlink = "rm2";
    await expect(f.kind.deleteLedger("rm2")).rejects.toMatchObject({ code: "EIO" });
    failUnlink = undefined;

    const b = await deliveredCall(f.kind, "rm2");
    // The next call's parent and the manifest are what the file holds.
    expect(b.parentCallId).toBe(a.modelCallId);
    const manifest = (await f.kind.captureManifest("rm2")).records.map((r) => r.model_call_id);
    expect(manifest).toEqual(await fileCalls("rm2"));
    expect(manifest).toEqual([a.modelCallId, b.modelCallId]);
  });
});

describe("a commit's clean-up whose free of a restored ledger fails", () => {
  it("frees the other restored ledgers the scope left out, and the next commit's clean-up frees the one that failed", async () => {
    await f.kind.install(
      [
        { episode_id: ep("fa"), rows: [ledgerRow("fa", "mc-fa")], generation_cuts: [] },
        { episode_id: ep("fb"), rows: [ledgerRow("fb", "mc-fb")], generation_cuts: [] },
      ],
      {},
    );
    expect([existsSync(ledgerFile("fa-a1")), existsSync(ledgerFile("fb-a1"))]).toEqual([true, true]);
    failUnlink = "fa-a1";
    // Its failure is the hook's (the control plane logs it; the commit stays committed).
    await expect(f.kind.afterCommit([ep("other")])).rejects.toMatchObject({ code: "EIO" });
    failUnlink = undefined;
    // The one that could be freed was.
    expect(existsSync(ledgerFile("fb-a1"))).toBe(false);
    // The one that could not is still restored state, freed by the next commit's clean-up.
    expect(f.kind.hasLiveState()).toBe(true);
    await f.kind.afterCommit([ep("other")]);
    expect(existsSync(ledgerFile("fa-a1"))).toBe(false);
    expect(f.kind.hasLiveState()).toBe(false);
  });
});
