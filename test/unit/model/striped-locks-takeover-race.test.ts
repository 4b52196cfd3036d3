import { spawnSync } from "node:child_process";
import { existsSync, utimesSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it, vi } from "vitest";
import { steer, interleaveTakeOver } from "../../support/takeover-interleaving.js";

/**
 * Ledger stripe locks in three processes' stead (three StripedLocks in this process, each acquiring
 * in its own async context, so every file system call can say whose it is) against one stripe
 * whose lock file a dead owner left: B reads it and stalls; A takes it over completely; then B goes
 * on, and C starts (or, having read the dead owner's file too, goes on) right after B's k-th file
 * system call, for every k until B has none left. Exactly one of them may hold the stripe: two
 * would append to the same ledger files.
 */
vi.mock("node:fs/promises", async (importOriginal) => (await import("../../support/takeover-interleaving.js")).steeredFsPromises(await importOriginal()));

const { StripedLocks } = await import("../../../participants/kinds/model/striped-locks.js");
type Locks = InstanceType<typeof StripedLocks>;

/** How long a loser waits for the stripe before it is refused. */
const WAIT_MS = 60;
const DEAD = spawnSync(process.execPath, ["-e", ""]).pid!;
const STALE = `${DEAD} 0123456789abcdef`;

interface Outcome {
  holders: string[];
  refusals: Record<string, string>;
  /** Whether C ran before B had made its k-th call after going on (else B had none left). */
  cInsideB: boolean;
  /** The lock directory while the race's holders still hold, then once every racer closed. */
  held: string[];
  closed: string[];
}

/** Three StripedLocks over one directory, one stripe: every key is on it. */
async function racers(): Promise<{ dir: string; path: string; make: () => Locks }> {
  const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-stripe-race-"));
  const locksDir = join(dir, "locks");
  await mkdir(locksDir);
  const make = () => new StripedLocks(locksDir, 1, WAIT_MS, 60_000);
  return { dir, path: join(locksDir, "stripe-0000.lock"), make };
}

async function settle(p: Promise<unknown>): Promise<{ held: true } | { held: false; message: string }> {
  return p.then(
    () => ({ held: true }) as const,
    (error: unknown) => ({ held: false, message: (error as Error).message }) as const,
  );
}

async function finish(dir: string, all: Record<string, { locks: Locks; run: Promise<unknown> }>): Promise<Omit<Outcome, "cInsideB">> {
  steer.after = async () => undefined;
  const settled = Object.fromEntries(await Promise.all(Object.entries(all).map(async ([name, r]) => [name, await settle(r.run)] as const)));
  const held = (await readdir(join(dir, "locks"))).filter((name) => !name.startsWith(".owner-")).sort();
  for (const r of Object.values(all)) await r.locks.close();
  const closed = (await readdir(join(dir, "locks"))).sort();
  await rm(dir, { recursive: true, force: true });
  return {
    holders: Object.entries(settled).filter(([, s]) => s.held).map(([name]) => name),
    refusals: Object.fromEntries(Object.entries(settled).flatMap(([name, s]) => (s.held ? [] : [[name, s.message]]))),
    held,
    closed,
  };
}

/** One interleaving: C starts (or goes on) after B's k-th call once A holds the stripe. */
async function race(k: number, cReadStaleFirst: boolean): Promise<Outcome> {
  const { dir, path, make } = await racers();
  await writeFile(path, STALE);
  const locks = { A: make(), B: make(), C: make() };
  const { a, b, c, cInsideB } = await interleaveTakeOver({ path, stale: STALE, k, cReadStaleFirst, start: (name) => locks[name].run("k", async () => name) });
  expect(a).toBe("A");
  return { ...(await finish(dir, { A: { locks: locks.A, run: Promise.resolve(a) }, B: { locks: locks.B, run: b }, C: { locks: locks.C, run: c } })), cInsideB };
}

const REFUSED = "ledger lock stripe-0000.lock is held by another live process";

describe("ledger stripe locks: breaking a dead owner's lock", () => {
  it.each([
    ["C starts", false],
    ["C, having read the dead owner's file too, goes on", true],
  ])("%s after any of B's file system calls: one holder, the others refused, nothing left behind", { timeout: 60_000 }, async (_what, cReadStaleFirst) => {
    let k = 0;
    for (; k < 400; k++) {
      const outcome = await race(k, cReadStaleFirst);
      expect({ k, holders: outcome.holders, refusals: outcome.refusals, held: outcome.held, closed: outcome.closed }).toEqual({
        k,
        holders: ["A"],
        refusals: { B: REFUSED, C: REFUSED },
        held: ["stripe-0000.lock"],
        closed: [],
      });
      if (!outcome.cInsideB) break;
    }
    expect(k, "B ran out of calls before the bound: every interleaving was tried").toBeLessThan(400);
    expect(k, "B went on through its take-over attempt").toBeGreaterThan(2);
  });

  it("a lock file never shows empty: a holder stalled right after its lock file appeared, for longer than an empty file's grace, keeps the stripe to itself", async () => {
    const { dir, path, make } = await racers();
    const locks = { P: make(), Q: make() };
    let q: Promise<unknown> | undefined;
    steer.after = async (who) => {
      if (who !== "P" || q !== undefined || !existsSync(path)) return;
      // P's lock file has just appeared: P stalls (a busy thread pool) while its file looks 60 s old.
      const past = new Date(Date.now() - 60_000);
      utimesSync(path, past, past);
      q = steer.actor.run("Q", () => locks.Q.run("k", async () => "Q"));
      await q.catch(() => undefined);
    };
    const p = steer.actor.run("P", () => locks.P.run("k", async () => "P"));
    await p.catch(() => undefined);
    expect(q, "P's lock file appeared").toBeDefined();
    const outcome = await finish(dir, { P: { locks: locks.P, run: p }, Q: { locks: locks.Q, run: q! } });
    expect(outcome).toEqual({ holders: ["P"], refusals: { Q: REFUSED }, held: ["stripe-0000.lock"], closed: [] });
  });
});
