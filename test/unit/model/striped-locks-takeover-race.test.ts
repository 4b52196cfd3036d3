import { AsyncLocalStorage } from "node:async_hooks";
import { spawnSync } from "node:child_process";
import { existsSync, utimesSync } from "node:fs";
import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it, vi } from "vitest";

/**
 * Ledger stripe locks in three processes' stead (three StripedLocks in this process, each acquiring
 * in its own async context, so every file system call can say whose it is) against one stripe
 * whose lock file a dead owner left: B reads it and stalls; A takes it over completely; then B goes
 * on, and C starts (or, having read the dead owner's file too, goes on) right after B's k-th file
 * system call, for every k until B has none left. Exactly one of them may hold the stripe: two
 * would append to the same ledger files.
 */
const steer = vi.hoisted(() => ({
  actor: undefined as unknown as import("node:async_hooks").AsyncLocalStorage<string>,
  /** Awaited after each file system call settles, with the caller's name and the call. */
  after: async (_who: string | undefined, _call: string, _args: unknown[], _result: unknown): Promise<void> => undefined,
}));

vi.mock("node:fs/promises", async (importOriginal) => {
  const actual = await importOriginal<Record<string, unknown>>();
  const steered: Record<string, unknown> = {};
  for (const [name, value] of Object.entries(actual)) {
    if (typeof value !== "function") {
      steered[name] = value;
      continue;
    }
    steered[name] = (...args: unknown[]) => {
      const result: unknown = (value as (...a: unknown[]) => unknown)(...args);
      if (!(result instanceof Promise)) return result;
      const who = steer.actor?.getStore();
      return result.then(
        async (value: unknown) => (await steer.after(who, name, args, value), value),
        async (error: unknown) => {
          await steer.after(who, name, args, undefined);
          throw error;
        },
      );
    };
  }
  return { ...steered, default: steered };
});

steer.actor = new AsyncLocalStorage<string>();
const { StripedLocks } = await import("../../../participants/kinds/model/striped-locks.js");
type Locks = InstanceType<typeof StripedLocks>;

function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

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
  const stalled = { B: gate(), C: gate() };
  const goOn = { B: gate(), C: gate() };
  let bCalls = -1; // counting starts once B goes on
  let c: Promise<unknown> | undefined;
  const start = (name: "A" | "B" | "C") => steer.actor.run(name, () => locks[name].run("k", async () => name));
  const runC = () => {
    if (cReadStaleFirst) goOn.C.open();
    else c = start("C");
    return c!.then(
      () => undefined,
      () => undefined,
    );
  };
  let cInsideB = false;
  steer.after = async (who, call, args, result) => {
    if ((who === "B" || who === "C") && call === "readFile" && args[0] === path && result === STALE && stalled[who]) {
      // Its first read of the dead owner's file: it stalls there until told to go on.
      const first = stalled[who];
      stalled[who] = undefined as never;
      first.open();
      await goOn[who].promise;
      return;
    }
    if (who === "B" && bCalls >= 0 && ++bCalls === k) {
      cInsideB = true;
      await runC();
    }
  };
  const b = start("B");
  const waits = [stalled.B.promise];
  if (cReadStaleFirst) {
    c = start("C");
    waits.push(stalled.C.promise);
  }
  await Promise.all(waits);
  const a = start("A");
  expect(await a).toBe("A");
  bCalls = 0;
  if (k === 0) {
    cInsideB = true;
    await runC();
  }
  goOn.B.open();
  await b.catch(() => undefined);
  if (!cInsideB) await runC();
  return { ...(await finish(dir, { A: { locks: locks.A, run: a }, B: { locks: locks.B, run: b }, C: { locks: locks.C, run: c! } })), cInsideB };
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
