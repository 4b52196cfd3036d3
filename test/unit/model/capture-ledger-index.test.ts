import { mkdtemp, rm } from "node:fs/promises";
import * as fsPromises from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CaptureLedger, ModelKind, type ModelRecord } from "../../../participants/kinds/model/index.js";
import { ledgerRow } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";

// Counts directory listings: a rollout's keys come from an in-memory index, not from readdir.
vi.mock("node:fs/promises", async (original) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await original<typeof import("node:fs/promises")>();
  return withOverrides(actual, { readdir: vi.fn(actual.readdir) });
});
const readdir = vi.mocked(fsPromises.readdir);

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-index-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

describe("the capture ledger's rollout index", () => {
  it("restore and retire find a rollout's keys without listing the directory", async () => {
    const seed = new CaptureLedger(join(dir, "ledger"));
    for (let r = 0; r < 30; r++) for (const suffix of ["", "-a1", "-a2"]) await seed.append(ledgerRow(`ix${r}${suffix}`, `mc-${r}`));
    await seed.close();
    const kind = new ModelKind({ ledgerDir: join(dir, "ledger"), cutBackend: null });
    try {
      const records: ModelRecord[] = Array.from({ length: 30 }, (_, r) => ({ episode_id: ep(`ix${r}`, 1), rows: [ledgerRow(`ix${r}-a1`, `mc-${r}`)], generation_cuts: [] }));
      await kind.ledger.rows("ix0"); // start-up: the one listing
      expect(readdir).toHaveBeenCalled(); // the spy sees the ledger's listings
      readdir.mockClear();
      await kind.install(records, {});
      await kind.retire([ep("ix0", 2)]);
      expect(readdir).not.toHaveBeenCalled();
      expect((await kind.ledger.keysOfRollout("ix1")).map((k) => k.key)).toEqual(["ix1-a2"]);
      expect(await kind.ledger.keysOfRollout("ix0")).toEqual([]);
      // Memory-only keys (a first call that never completed) are found and forgotten too.
      await kind.ledger.rows("ix-new-a3");
      expect((await kind.ledger.keysOfRollout("ix-new")).map((k) => k.key)).toEqual(["ix-new-a3"]);
      kind.ledger.evict("ix-new");
      expect(await kind.ledger.keysOfRollout("ix-new")).toEqual([]);
      expect(readdir).not.toHaveBeenCalled();
    } finally {
      await kind.close();
    }
  });
});
