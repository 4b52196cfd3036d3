import { existsSync } from "node:fs";
import * as fsPromises from "node:fs/promises";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { ledgerRow, modelFixture, settle, type ModelFixture } from "./model-fixtures.js";
import { ep } from "../../support/episode.js";

// The first unlink of `gate.key` waits until released, then fails (EIO); later ones go through.
let gate: { key: string; reached: boolean; open: Promise<void>; release: () => void; failed: boolean } | undefined;
vi.mock("node:fs/promises", async (importOriginal) => {
  const actual = await importOriginal<typeof fsPromises>();
  return {
    ...actual,
    unlink: async (path: Parameters<typeof actual.unlink>[0]) => {
      if (gate && !gate.failed && String(path).endsWith(`/${gate.key}.lineage.jsonl`)) {
        gate.reached = true;
        await gate.open;
        gate.failed = true;
        throw Object.assign(new Error(`EIO: i/o error, unlink '${String(path)}'`), { code: "EIO", syscall: "unlink", path: String(path) });
      }
      return actual.unlink(path);
    },
  };
});

function gateUnlinkOf(key: string): NonNullable<typeof gate> {
  let release!: () => void;
  const open = new Promise<void>((resolve) => (release = resolve));
  gate = { key, reached: false, open, release, failed: false };
  return gate;
}

let f: ModelFixture;
beforeEach(async () => {
  gate = undefined;
  f = await modelFixture();
});
afterEach(async () => {
  gate?.release();
  gate = undefined;
  await f.close();
});

/** Installs a-a1 as a restored ledger and starts a commit's clean-up that frees it, its unlink held. */
async function freeingHeld() {
  await f.kind.install([{ episode_id: ep("a"), rows: [ledgerRow("a", "mc-restored")], generation_cuts: [] }], {});
  const unlink = gateUnlinkOf("a-a1");
  const hook = f.kind.afterCommit([ep("other")]);
  for (let i = 0; i < 100 && !unlink.reached; i++) await settle(1);
  expect(unlink.reached).toBe(true);
  return { unlink, hook };
}

describe("a commit's clean-up whose free fails after a retire or forget dropped that restored ledger", () => {
  it("a retire meanwhile: the ledger is gone when it replies, and no restored state of it comes back", async () => {
    const { unlink, hook } = await freeingHeld();
    const retired = f.kind.retire([ep("a", 1)]);
    await settle();
    unlink.release();
    await expect(hook).rejects.toMatchObject({ code: "EIO" });
    await retired;
    expect(existsSync(join(f.dir, "ledger", "a-a1.lineage.jsonl"))).toBe(false);
    // Before: a-a1 went back into the restored keys, live state of a retired attempt (a restore refused as not fresh).
    expect(f.kind.hasLiveState()).toBe(false);
  });

  it("a forget meanwhile: its restored state stays forgotten (its file stays, as a forget leaves files)", async () => {
    const { unlink, hook } = await freeingHeld();
    await f.kind.forget(["a"]);
    unlink.release();
    await expect(hook).rejects.toMatchObject({ code: "EIO" });
    expect(f.kind.hasLiveState()).toBe(false);
  });
});
