import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { LedgerRow } from "../../../participants/kinds/model/index.js";
import { CHAT, chat, cutRecord, emptyRecords, ledgerRow, modelFixture, type ModelFixture } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";

// The ledger API (`DELETE /ng-capture/v1/ledger/<key>`, `POST /ng-capture/v1/ledger/retire`) is
// documented to remove a ledger. After a restore the ledger of the next attempt also has restored
// state beside its file (a restored generation cut, the restored key): removing the ledger must
// remove that too, as the checkpoint retire does (dropRestored), or the next commit exports a
// "deleted" episode again and the next call continues a cut whose lineage was deleted.
let f: ModelFixture;
beforeEach(async () => {
  f = await modelFixture();
});
afterEach(async () => {
  await f.close();
});

const row = (capture_key: string, model_call_id: string): LedgerRow => ({ ...ledgerRow(capture_key, model_call_id), staging_key: `stage/${model_call_id}` });

async function restoreWithCut(): Promise<void> {
  await f.kind.install([{ episode_id: ep("ro"), rows: [row("ro", "mc-1")], generation_cuts: [cutRecord("ro", chat("again"))] }], {});
  expect(f.kind.statusExtras().restored_generation_cuts).toBe(1);
}

describe("ledger API removal of a restored key", () => {
  it("DELETE drops the restored cut too: nothing is exported for the deleted ledger", async () => {
    await restoreWithCut();
    await f.kind.deleteLedger("ro-a1");
    expect(await f.kind.ledger.rows("ro-a1")).toEqual([]);
    expect(await f.kind.exportRecords([ep("ro", 1)])).toEqual(emptyRecords(ep("ro", 1)));
    expect(f.kind.statusExtras().restored_generation_cuts).toBe(0);
  });

  it("ledger retire drops the restored cut too, and the next call does not continue it", async () => {
    await restoreWithCut();
    await f.kind.retireLedgers({ rollout_id: "ro", attempt: 1 });
    expect(await f.kind.exportRecords([ep("ro", 1)])).toEqual(emptyRecords(ep("ro", 1)));
    const ticket = await f.kind.admit("ro-a1", CHAT, chat("again"));
    expect(ticket.claimedCut).toBeNull();
  });
});
