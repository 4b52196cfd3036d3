import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Collector, type CollectorController } from "../../../coordinator/collect/collector.js";
import { DispatchLog } from "../../../coordinator/collect/dispatch-log.js";

/**
 * The dispatch log must be on disk before the `/run` it names is sent: after a power loss the
 * next start retires what the log names, and an attempt it lost would be sent again unretired.
 * `durable` is what the log held when its last fdatasync completed (each sync is slowed a little,
 * so appends made meanwhile pile up for the next one); the fake fetch checks its attempt is in it.
 */
const disk = vi.hoisted(() => ({ log: undefined as string | undefined, durable: "", syncs: 0 }));

vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const open: typeof real.open = async (path, flags, mode) => {
    const handle = await real.open(path, flags, mode);
    if (String(path) !== disk.log) return handle;
    const recorded = (sync: () => Promise<void>) => async () => {
      const synced = readFileSync(disk.log!, "utf8");
      await new Promise((resolve) => setTimeout(resolve, 20));
      await sync();
      disk.syncs++;
      disk.durable = synced;
    };
    return handleWith(handle, { datasync: recorded(() => handle.datasync()), sync: recorded(() => handle.sync()) });
  };
  return withOverrides(real, { open });
});

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-dispatch-sync-"));
  disk.log = join(dir, "dispatched.jsonl");
  disk.durable = "";
  disk.syncs = 0;
});
afterEach(async () => {
  vi.unstubAllGlobals();
  disk.log = undefined;
  await rm(dir, { recursive: true, force: true });
});

const line = (e: { rollout_id: string; attempt: number; restored?: true }) => `${JSON.stringify(e)}\n`;

const controller = {
  list: async () => ({ latest: null, checkpoints: [] }),
  status: async () => ({ checkpoint: null, participants: [] }),
  forget: async (req: { rollout_ids: string[] }) => ({ forgotten: req.rollout_ids }),
} as unknown as CollectorController;

describe("dispatch log durability", () => {
  it("syncs an attempt's line before its /run is sent, one sync for the dispatches made together", async () => {
    const rows = 16;
    const unsynced: string[] = [];
    vi.stubGlobal("fetch", async (_url: string, init: { body: string }) => {
      const { rollout_id, attempt } = JSON.parse(init.body) as { rollout_id: string; attempt: number };
      if (!disk.durable.includes(line({ rollout_id, attempt }))) unsynced.push(rollout_id);
      return new Response(JSON.stringify({ reward: 1 }), { status: 200, headers: { "content-type": "application/json" } });
    });
    const collector = new Collector({
      rows: Array.from({ length: rows }, (_, i) => ({ rolloutId: `r${i}`, task: {} })),
      runUrl: "http://127.0.0.1:1/run",
      outPath: join(dir, "results.jsonl"),
      checkpointDir: dir,
      controller,
      concurrency: rows,
      logger: pino({ level: "silent" }),
    });
    await collector.start();
    expect(await collector.run()).toMatchObject({ finished: rows });
    expect(unsynced).toEqual([]);
    // The first dispatch's sync, then one for the fifteen queued while it ran.
    expect(disk.syncs).toBeGreaterThan(0);
    expect(disk.syncs).toBeLessThanOrEqual(2);
  });

  it("recordRestored returns only once its lines are synced", async () => {
    const log = await DispatchLog.create(disk.log!, "run-1");
    await log.recordRestored([{ rollout_id: "a", attempt: 1 }]);
    expect(disk.durable).toContain(line({ rollout_id: "a", attempt: 1, restored: true }));
  });

  it("keeps the order of lines appended together and fails every append of a group whose write fails", async () => {
    const log = await DispatchLog.create(disk.log!, "run-1");
    await Promise.all([log.record({ rollout_id: "a", attempt: 0 }), log.recordRestored([{ rollout_id: "a", attempt: 1 }]), log.record({ rollout_id: "a", attempt: 1 })]);
    const history = await DispatchLog.read(disk.log!);
    expect(Object.fromEntries(history!.latest)).toEqual({ a: 1 });
    expect([...history!.restoredOnly]).toEqual([]);
    await rm(dir, { recursive: true, force: true });
    await expect(Promise.all([log.record({ rollout_id: "b", attempt: 0 }), log.record({ rollout_id: "c", attempt: 0 })])).rejects.toMatchObject({ code: "ENOENT" });
  });
});
