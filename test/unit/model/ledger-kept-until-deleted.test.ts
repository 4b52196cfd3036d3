import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ModelKind } from "../../../participants/kinds/model/index.js";
import { ep } from "../../support/episode.js";
import { deliveredCall, modelFixture, type ModelFixture } from "./model-fixtures.js";

// docs/model.md, "Ledger files are kept until someone deletes them": forget frees no ledger file
// (the framework reads finished episodes' capture manifests); the ledger API's retire and delete
// free the file and its index entries at once.
const ROLLOUTS = 40;
const ids = Array.from({ length: ROLLOUTS }, (_, r) => `kept${r}`);

let fx: ModelFixture;
beforeEach(async () => {
  fx = await modelFixture({ cuts: false });
});
afterEach(async () => {
  await fx.close();
});

const ledgerFiles = async () => (await readdir(join(fx.dir, "ledger"))).filter((name) => name.endsWith(".lineage.jsonl")).length;
async function indexedKeys(kind: ModelKind): Promise<number> {
  let keys = 0;
  for (const id of ids) keys += (await kind.ledger.keysOfRollout(id)).length;
  return keys;
}

describe("a finished rollout's ledger", () => {
  it("stays on disk and indexed after forget, and goes with the ledger API's retire or delete", async () => {
    for (const id of ids) for (const turn of ["a", "b"]) await deliveredCall(fx.kind, id, turn);
    await fx.kind.forget(ids);
    expect(await ledgerFiles()).toBe(ROLLOUTS);
    expect(await indexedKeys(fx.kind)).toBe(ROLLOUTS);
    expect(fx.kind.ledger.cacheSize().rows).toBe(0); // forget drops the cached rows only
    expect((await fx.kind.captureManifest("kept0")).records).toHaveLength(2);

    for (const id of ids.slice(0, ROLLOUTS / 2)) await fx.kind.retireLedgers(ep(id, 0));
    for (const id of ids.slice(ROLLOUTS / 2)) await fx.kind.deleteLedger(id);
    expect(await ledgerFiles()).toBe(0);
    expect(await indexedKeys(fx.kind)).toBe(0);
  });
});
