import { mkdtemp, readFile, readdir, rm as realRm, writeFile } from "node:fs/promises";
import { processIdentity } from "../../../protocol/process-identity.js";
import { hostname, tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it, vi } from "vitest";
import { waitUntil } from "../../support/wait-until.js";

/**
 * Two collectors that judged the same stale collector.pid take it over at once. The one that comes
 * second must not remove the first one's fresh lock and link its own. The file system calls on
 * collector.pid are steered to the worst interleaving: a removal by name lands late (a slow shared
 * file system), and the second one's move of the file happens just after the first one linked its lock.
 */
const STALE = `4194301 ${hostname()}\n`;
const MINE = `${process.pid} ${hostname()} ${processIdentity()!.startTime} ${processIdentity()!.bootId}\n`;
let rmCalls = 0;
let renameCalls = 0;
let secondArrived: () => void = () => undefined;
const bothArrived = new Promise<void>((resolve) => (secondArrived = resolve));

vi.mock("node:fs/promises", async (importOriginal) => {
  const actual = await importOriginal<typeof import("node:fs/promises")>();
  const isLock = (path: unknown) => String(path).endsWith("/collector.pid");
  return {
    ...actual,
    rm: async (path: string, options?: object) => {
      if (isLock(path)) await new Promise((r) => setTimeout(r, rmCalls++ === 0 ? 5 : 100));
      return actual.rm(path, options as never);
    },
    rename: async (from: string, to: string) => {
      if (isLock(from)) {
        const n = renameCalls++;
        // Both have judged the stale file by now; the first moves it, the second once the first holds the lock.
        if (n === 0) await bothArrived;
        if (n === 1) {
          secondArrived();
          await waitUntil(async () => (await actual.readFile(from, "utf8").catch(() => "")) === MINE, "the first collector's lock");
        }
      }
      return actual.rename(from, to);
    },
  };
});

const { acquireCollectorLock } = await import("../../../coordinator/collect/collector-lock.js");

describe("collector.pid take-over race", () => {
  it("two collectors taking over the same stale lock: one holds it, the other is refused, no file left aside", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-lock-race-"));
    try {
      await writeFile(join(dir, "collector.pid"), STALE);
      const results = await Promise.allSettled([acquireCollectorLock(dir), acquireCollectorLock(dir)]);
      expect(results.filter((r) => r.status === "fulfilled"), "both collectors believe they hold collector.pid").toHaveLength(1);
      expect(results.find((r) => r.status === "rejected")).toMatchObject({ reason: { code: "checkpoint_conflict" } });
      expect(renameCalls, "the second collector moved the first one's fresh lock aside (and gave it back)").toBe(2);
      expect(await readFile(join(dir, "collector.pid"), "utf8")).toBe(MINE);
      expect(await readdir(dir)).toEqual(["collector.pid"]);
    } finally {
      await realRm(dir, { recursive: true, force: true });
    }
  });
});
