import { AsyncLocalStorage } from "node:async_hooks";
import { spawnSync } from "node:child_process";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it, vi } from "vitest";

/**
 * Three collectors start at once against one stale collector.pid, every interleaving that matters
 * tried in turn: B reads the stale file and stalls; A takes it over completely; then B goes on, and
 * C starts (or, having read the stale file too, goes on) right after B's k-th file system call, for
 * every k until B has none left. Exactly one of them may end up holding the lock. The acquirers run
 * in this process, each in its own async context, so every file system call can say whose it is.
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
const { acquireCollectorLock } = await import("../../../coordinator/collect/collector-lock.js");
type Lock = Awaited<ReturnType<typeof acquireCollectorLock>>;

function gate(): { promise: Promise<void>; open: () => void } {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

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
  const stalled = { B: gate(), C: gate() };
  const goOn = { B: gate(), C: gate() };
  let bCalls = -1; // counting starts once B goes on
  let c: Promise<Lock> | undefined;
  const start = (name: string) => steer.actor.run(name, () => acquireCollectorLock(dir));
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
      // Its first read of the stale file: it stalls there until told to go on.
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
  const a = await steer.actor.run("A", () => acquireCollectorLock(dir));
  expect(a.tookOver).toMatch(/is not running/);
  bCalls = 0;
  if (k === 0) {
    cInsideB = true;
    await runC();
  }
  goOn.B.open();
  await b.catch(() => undefined);
  if (!cInsideB) await runC();
  steer.after = async () => undefined;
  const settled = { A: { status: "fulfilled", value: a }, B: await settle(b), C: await settle(c!) } as const;
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
