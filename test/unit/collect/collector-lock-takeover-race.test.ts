import { spawnSync } from "node:child_process";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it, vi } from "vitest";
import { interleaveTakeOver } from "../../support/takeover-interleaving.js";

/**
 * Three collectors start at once against one stale collector.pid, every interleaving that matters
 * tried in turn: B reads the stale file and stalls; A takes it over completely; then B goes on, and
 * C starts (or, having read the stale file too, goes on) right after B's k-th file system call, for
 * every k until B has none left. Exactly one of them may end up holding the lock. The acquirers run
 * in this process, each in its own async context, so every file system call can say whose it is.
 */
vi.mock("node:fs/promises", async (importOriginal) => (await import("../../support/takeover-interleaving.js")).steeredFsPromises(await importOriginal()));

const { acquireCollectorLock } = await import("../../../coordinator/collect/collector-lock.js");

const DEAD = spawnSync(process.execPath, ["-e", ""]).pid!;
const STALE = `${DEAD} ${hostname()}\n`;

interface Outcome {
  holders: string[];
  refusals: Record<string, unknown>;
  /** Whether C ran before B had made its k-th call after going on (else B had none left). */
  cInsideB: boolean;
  files: string[];
}

/** One interleaving: C starts (or goes on) after B's k-th call once A holds the lock. */
async function race(k: number, cReadStaleFirst: boolean): Promise<Outcome> {
  const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-lock-race-"));
  const path = join(dir, "collector.pid");
  await writeFile(path, STALE);
  const { a, b, c, cInsideB } = await interleaveTakeOver({ path, stale: STALE, k, cReadStaleFirst, start: () => acquireCollectorLock(dir) });
  expect(a.tookOver).toMatch(/is not running/);
  const settled = { A: { status: "fulfilled", value: a }, B: await settle(b), C: await settle(c) } as const;
  const files = (await readdir(dir)).sort();
  const holders = Object.entries(settled).filter(([, r]) => r.status === "fulfilled").map(([name]) => name);
  const refusals = Object.fromEntries(Object.entries(settled).flatMap(([name, r]) => (r.status === "rejected" ? [[name, (r.reason as { code?: string }).code]] : [])));
  for (const r of Object.values(settled)) if (r.status === "fulfilled") await r.value.release();
  await rm(dir, { recursive: true, force: true });
  return { holders, refusals, cInsideB, files };
}

async function settle<T>(p: Promise<T>): Promise<PromiseSettledResult<T>> {
  return p.then(
    (value) => ({ status: "fulfilled", value }) as const,
    (reason: unknown) => ({ status: "rejected", reason }) as const,
  );
}

describe("collector.pid take-over: three collectors against one stale file", () => {
  it.each([
    ["C starts", false],
    ["C, having read the stale file too, goes on", true],
  ])("%s after any of B's file system calls: one holder, the others refused with checkpoint_conflict, nothing left aside", { timeout: 30_000 }, async (_what, cReadStaleFirst) => {
    let k = 0;
    for (; k < 64; k++) {
      const outcome = await race(k, cReadStaleFirst);
      expect({ k, holders: outcome.holders, refusals: outcome.refusals, files: outcome.files }).toEqual({
        k,
        holders: ["A"],
        refusals: { B: "checkpoint_conflict", C: "checkpoint_conflict" },
        files: ["collector.pid"],
      });
      if (!outcome.cInsideB) break;
    }
    expect(k, "B ran out of calls before the bound: every interleaving was tried").toBeLessThan(64);
    expect(k, "B went on through its take-over attempt").toBeGreaterThan(2);
  });
});
