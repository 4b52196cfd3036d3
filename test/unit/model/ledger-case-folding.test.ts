import { mkdtemp, readdir, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CaptureLedger } from "../../../participants/kinds/model/index.js";
import { nodeCaseProbeFs, refuseCaseFoldingDir, type CaseProbeFs } from "../../../participants/storage/case-folding-dir.js";
import { ledgerRow } from "./model-fixtures.js";

// One ledger file per capture key: on a filesystem that folds case, rollouts `R1` and `r1` would
// share `r1.lineage.jsonl` under different stripe locks, their rows interleaved, and a checkpoint of
// one would export the other's lineage. Linux here is case-sensitive: the folding answer is injected.
let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-case-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** The real filesystem, except that a lookup answers as a case-folding one would. */
function caseFolding(asked: string[]): CaseProbeFs {
  return {
    create: (path) => nodeCaseProbeFs.create(path),
    exists: async (path) => {
      asked.push(path);
      const names = await readdir(join(path, ".."));
      const wanted = path.slice(path.lastIndexOf("/") + 1).toLowerCase();
      return names.some((name) => name.toLowerCase() === wanted);
    },
    remove: (path) => nodeCaseProbeFs.remove(path),
  };
}

describe("a capture ledger on a case-insensitive filesystem", () => {
  it("is refused storage_error naming the directory, for every use, and the probe leaves nothing behind", async () => {
    const asked: string[] = [];
    const ledger = new CaptureLedger(dir, undefined, undefined, { caseProbe: caseFolding(asked) });
    try {
      const refusal = { code: "storage_error", message: expect.stringContaining(`capture ledger directory ${dir} is on a case-insensitive filesystem`) };
      await expect(ledger.append(ledgerRow("R1", "mc-1"))).rejects.toMatchObject(refusal);
      await expect(ledger.rows("r1")).rejects.toMatchObject(refusal);
      // It looked the probe up under its upper-case name.
      expect(asked).toHaveLength(1);
      expect(asked[0]).toMatch(/\.CASE-PROBE\.\d+\.[0-9A-F]{12}$/);
      expect(await readdir(dir)).not.toContainEqual(expect.stringMatching(/case-probe/i));
    } finally {
      await ledger.close().catch(() => undefined);
    }
  });

  it("the probe passes a case-sensitive directory (a real one here) and removes its file", async () => {
    await expect(refuseCaseFoldingDir(dir, "capture ledger directory")).resolves.toBeUndefined();
    expect(await readdir(dir)).toEqual([]);
    const ledger = new CaptureLedger(dir);
    try {
      await ledger.append(ledgerRow("R1", "mc-1"));
      await ledger.append(ledgerRow("r1", "mc-2"));
      expect((await ledger.rows("R1")).map((row) => row.model_call_id)).toEqual(["mc-1"]);
      expect((await ledger.rows("r1")).map((row) => row.model_call_id)).toEqual(["mc-2"]);
      expect((await readdir(dir)).filter((name) => name.endsWith(".lineage.jsonl")).sort()).toEqual(["R1.lineage.jsonl", "r1.lineage.jsonl"]);
    } finally {
      await ledger.close();
    }
  });

  it("a probe file that cannot be created is that storage failure, not a pass", async () => {
    const failing: CaseProbeFs = { ...nodeCaseProbeFs, create: async () => Promise.reject(Object.assign(new Error("EROFS: read-only file system"), { code: "EROFS" })) };
    await expect(refuseCaseFoldingDir(dir, "capture ledger directory", failing)).rejects.toMatchObject({ code: "EROFS" });
  });
});

describe("probe files a crash left in the ledger directory (between their create and remove)", () => {
  it("are removed at open once older than a minute, case and write probes alike; a fresh one (a probe running now) stays", async () => {
    const stale = [".case-probe.999999999.0123456789ab", `.case-probe.${process.pid}.0123456789ac`, ".write-probe.999999999.0123456789ad"];
    const fresh = ".case-probe.999999999.0123456789ae";
    const old = new Date(Date.now() - 120_000);
    for (const name of stale) {
      await writeFile(join(dir, name), "");
      await utimes(join(dir, name), old, old);
    }
    await writeFile(join(dir, fresh), "");
    await writeFile(join(dir, ".case-probe.unrelated"), "");
    await utimes(join(dir, ".case-probe.unrelated"), old, old);
    const ledger = new CaptureLedger(dir);
    try {
      expect(await ledger.rows("a")).toEqual([]);
    } finally {
      await ledger.close();
    }
    expect((await readdir(dir)).filter((name) => name.startsWith(".")).sort()).toEqual([fresh, ".case-probe.unrelated"].sort());
  });
});
