import { createHash } from "node:crypto";
import { mkdtemp, readFile, rm } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import type { TaskFile } from "../../../coordinator/collect/task-file.js";
import { TaskLineRef } from "../../../coordinator/collect/task-rows.js";
import { resultAppendsSettled } from "../../../coordinator/collect/results-file.js";
import { collectorIn, idleController } from "../../support/collector-fixture.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * The bound under test is --run-timeout-s (0.2 s here) as the exits' wait for storage; it is also
 * each /run's timeout, which a loaded machine can exceed, sending the row again. The /runs here are
 * untimed (the collector's stop still aborts them), so only the storage waits are bounded.
 */
vi.mock("../../../coordinator/collect/run-timeouts.js", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../../coordinator/collect/run-timeouts.js")>();
  class UntimedRuns extends original.RunTimeouts {
    override start(_ms: number) {
      return super.start(Number.MAX_SAFE_INTEGER);
    }
  }
  return { ...original, RunTimeouts: UntimedRuns };
});

/**
 * The exits that stop a collection where it is (SIGINT, SIGHUP, after a SIGTERM's checkpoint: halt()
 * then flushRecords(); a failed run()) wait for storage: the rows being appended to results.jsonl,
 * the tasks file's close (which waits for a task line read under way, as FileHandle.close does) and
 * the final records flush (which syncs results.jsonl first). On a mount that hangs, none of them
 * ends: each is waited for at most --run-timeout-s, and a warning names what was not waited for.
 *
 * The fake disk below holds results.jsonl's appends (`disk.hangAppends`) or its fdatasyncs
 * (`disk.hangSyncs`: the syncs before a records step, not the one that makes the file) for good, as a dead mount does, and fails the append of the row named by
 * `disk.failAppendOf` (a full disk). With `disk.instantSyncs`, results.jsonl's syncs end at once
 * without touching the disk: a test whose bound must expire for something else (a close that hangs)
 * does not also race a real fdatasync, which a loaded machine can hold past that bound.
 */
const disk = vi.hoisted(() => ({ hangAppends: false, appending: 0, hangSyncs: false, syncing: 0, instantSyncs: false, failAppendOf: "", holdAppends: undefined as Promise<void> | undefined }));

vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const never = new Promise<never>(() => undefined);
  const appendFile: typeof real.appendFile = async (path, data, options) => {
    if (String(path).endsWith("results.jsonl")) {
      if (disk.hangAppends) {
        disk.appending++;
        return never;
      }
      if (disk.holdAppends) {
        // A write under way on storage that hangs, then returns: the line lands once released.
        disk.appending++;
        await disk.holdAppends;
      }
      if (disk.failAppendOf && String(data).includes(`"rollout_id":"${disk.failAppendOf}"`)) {
        throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", syscall: "write" });
      }
    }
    return real.appendFile(path, data, options);
  };
  const { statSync } = await import("node:fs");
  const open: typeof real.open = async (path, flags, mode) => {
    if (disk.instantSyncs && flags === "r+" && String(path).endsWith("results.jsonl")) {
      const { size } = statSync(String(path));
      return { stat: async () => ({ size }), datasync: async () => undefined, close: async () => undefined } as unknown as Awaited<ReturnType<typeof real.open>>;
    }
    const handle = await real.open(path, flags, mode);
    if (!String(path).endsWith("results.jsonl")) return handle;
    return handleWith(handle, {
      datasync: () => {
        if (!disk.hangSyncs) return handle.datasync();
        disk.syncing++;
        return never;
      },
    });
  };
  return withOverrides(real, { appendFile, open });
});

let dir: string;
let server: Server | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-halt-bounded-"));
  Object.assign(disk, { hangAppends: false, appending: 0, hangSyncs: false, syncing: 0, instantSyncs: false, failAppendOf: "", holdAppends: undefined });
});
afterEach(async () => {
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

const trajectory = { task_name: null, prompt: null, nodes: [], reward: 1, turns: 0, stop_condition: null, is_completed: true, replay: null };

/** A /run server answering every row but `unanswered` with reward 1 and a trajectory; the rows it was sent; its URL. */
async function rewardingRun(unanswered: string[] = []): Promise<{ url: string; requests: string[] }> {
  const requests: string[] = [];
  server = createServer((req, res) => {
    let body = "";
    req.on("data", (chunk: Buffer) => (body += chunk.toString()));
    req.on("end", () => {
      const id = (JSON.parse(body) as { rollout_id: string }).rollout_id;
      requests.push(id);
      if (unanswered.includes(id)) return;
      res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1, trajectory }));
    });
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(server.address() as { port: number }).port}/run`, requests };
}

function capturingLogger() {
  const lines: string[] = [];
  const logger = pino({ level: "info" }, { write: (line: string) => void lines.push((JSON.parse(line) as { msg: string }).msg) });
  return { logger, lines };
}

/** A tasks file whose read never ends (a dead mount); its close waits for that read, as FileHandle.close does. */
function hungTasksFile(): { file: TaskFile; reading: () => boolean } {
  const never = new Promise<never>(() => undefined);
  let reading = false;
  const file = {
    path: join(dir, "tasks.jsonl"),
    read: () => {
      reading = true;
      return never;
    },
    close: () => (reading ? never : Promise.resolve()),
  } as unknown as TaskFile;
  return { file, reading: () => reading };
}

const records = () => ({ dir: join(dir, "records"), env: "gym", kind: "eval" as const, everyRows: 100, everySeconds: 600 });

describe("halt() with storage that hangs", () => {
  it("waits at most --run-timeout-s for the tasks file's close while a worker's task line read never ends", { timeout: 15_000 }, async () => {
    const { url } = await rewardingRun();
    const hung = hungTasksFile();
    const { logger, lines } = capturingLogger();
    const rows = [{ rolloutId: "h", task: new TaskLineRef(hung.file, 1, 0, 2, "") }];
    const collector = collectorIn(dir, url, idleController(), { rows, concurrency: 1, runTimeoutSeconds: 0.2, logger });
    await collector.start();
    void collector.run().catch(() => undefined); // its worker never comes back from the read
    await waitUntil(hung.reading, "h's task line read");
    await collector.halt({ resumeCheckpoint: true });
    expect(lines.filter((l) => l.startsWith("the tasks file's close did not end within --run-timeout-s of the halt"))).toHaveLength(1);
  });

  it("waits at most --run-timeout-s for a row's append to results.jsonl that never ends", { timeout: 15_000 }, async () => {
    const { url, requests } = await rewardingRun();
    disk.hangAppends = true;
    const { logger, lines } = capturingLogger();
    const collector = collectorIn(dir, url, idleController(), { concurrency: 1, runTimeoutSeconds: 0.2, logger });
    await collector.start();
    void collector.run().catch(() => undefined);
    await waitUntil(() => disk.appending === 1, "a's append to results.jsonl");
    await collector.halt();
    expect(requests).toEqual(["a"]);
    expect(lines.filter((l) => l.startsWith("rows being appended to results.jsonl did not end within --run-timeout-s of the halt"))).toHaveLength(1);
  });
});

describe("run() after a halt, with a results.jsonl write that never returns", () => {
  // A controller embedding the collector awaits run(): a worker held in a write to --out must not
  // keep it waiting for good, as the CLI's own exit does not.
  it("rejects storage_error within --run-timeout-s of the halt, the write under way still said to be under way", { timeout: 15_000 }, async () => {
    const { url } = await rewardingRun();
    disk.hangAppends = true;
    const { logger, lines } = capturingLogger();
    const collector = collectorIn(dir, url, idleController(), { concurrency: 1, runTimeoutSeconds: 0.2, logger });
    await collector.start();
    const run = collector.run();
    run.catch(() => undefined);
    await waitUntil(() => disk.appending === 1, "a's append to results.jsonl");
    await collector.halt();
    expect(await settlesWithin(run, 5_000)).toBe(true);
    await expect(run).rejects.toMatchObject({ code: "storage_error", message: expect.stringMatching(/a worker did not come back within --run-timeout-s \(0\.2 s\) of the halt/) });
    expect(collector.resultsWriteUnderWay).toBe(true); // what an embedding controller waits out (resultsWriteEnded) before another collector on --out
    // halt() said what it did not wait for, once; run()'s rejection adds no line of its own.
    expect(lines.filter((l) => l.startsWith("rows being appended to results.jsonl did not end within --run-timeout-s of the halt"))).toHaveLength(1);
  });
});

describe("run() after a halt, with a /run still in flight", () => {
  // Only storage holds a worker past the bound: a /run still running (its timeout paused by our
  // checkpoint, say) is no storage that hangs, and run() waits for it as for any worker.
  it("waits for the worker, and does not reject as if storage held it", { timeout: 15_000 }, async () => {
    const { url, requests } = await rewardingRun(["a"]);
    const collector = collectorIn(dir, url, idleController(), { concurrency: 1, runTimeoutSeconds: 0.2 });
    await collector.start();
    const run = collector.run();
    run.catch(() => undefined);
    await waitUntil(() => requests.length === 1, "a's /run");
    await collector.halt();
    expect(await settlesWithin(run, 1_000)).toBe(false);
    server!.closeAllConnections(); // the /run ends
    expect(await settlesWithin(run, 5_000)).toBe(true);
    const outcome = await run.then(() => undefined, (error: Error) => error.message);
    expect(outcome ?? "").not.toMatch(/did not come back within --run-timeout-s/);
  });
});

/**
 * Rows a and b finished, one's append to results.jsonl held by its storage and the other's queued
 * behind it, then the collector halted; `release` lets the held write return.
 */
async function haltedWithAppendHeld() {
  const { url } = await rewardingRun();
  let release!: () => void;
  disk.holdAppends = new Promise<void>((resolve) => (release = resolve));
  const rows = ["a", "b"].map((rolloutId) => ({ rolloutId, task: {} }));
  const out = join(dir, "results.jsonl");
  const collector = collectorIn(dir, url, idleController(), { rows, concurrency: 2, runTimeoutSeconds: 0.2 });
  await collector.start();
  void collector.run().catch(() => undefined);
  await waitUntil(() => disk.appending === 1 && collector.summary().finished === 2, "one row's append under way, the other's queued");
  await collector.halt();
  return { collector, release, out, url, rows };
}

describe("halt() with a results.jsonl append held by its storage", () => {
  it("appends no line queued behind it once the halt went on without it", { timeout: 15_000 }, async () => {
    const { collector, release, out } = await haltedWithAppendHeld();
    expect(collector.resultsWriteUnderWay).toBe(true);
    release();
    await resultAppendsSettled(out);
    const lines = (await readFile(out, "utf8")).split("\n").filter(Boolean).map((l) => (JSON.parse(l) as { rollout_id: string }).rollout_id);
    expect(lines).toHaveLength(1); // the one whose write had begun; the other never lands
  });
});

describe("a next collector in the same process, on the same --out, after a halt with an append held", () => {
  // A controller embedding the collector may start the next one on the same files before the held
  // write returns: the halted collector's lines that had not begun their write still never land.
  it("lets no line the halted collector gave up land once its held write returns", { timeout: 15_000 }, async () => {
    const { release, out, url, rows } = await haltedWithAppendHeld();
    disk.holdAppends = undefined; // the next collector's own appends are not held
    const next = collectorIn(dir, url, idleController(), { rows, concurrency: 2, runTimeoutSeconds: 0.2 });
    await next.start();
    release();
    await resultAppendsSettled(out);
    const lines = (await readFile(out, "utf8")).split("\n").filter(Boolean);
    expect(lines).toHaveLength(1); // the write that had begun; the one queued behind it was given up
  });
});

describe("the records flush after a halt, with results.jsonl's sync hanging", () => {
  it("waits at most --run-timeout-s and counts the rows whose records it did not wait for as not written", { timeout: 15_000 }, async () => {
    // a finishes (its line appended, its record buffered); h's /run is never answered.
    const { url, requests } = await rewardingRun(["h"]);
    const { logger, lines } = capturingLogger();
    const rows = ["a", "h"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorIn(dir, url, idleController(), { rows, concurrency: 1, runTimeoutSeconds: 0.2, logger, records: records() });
    await collector.start();
    disk.hangSyncs = true;
    void collector.run().catch(() => undefined);
    await waitUntil(() => requests.length === 2, "h's /run, after a finished");
    await collector.halt();
    await collector.flushRecords();
    expect(disk.syncing).toBe(1);
    expect(lines.filter((l) => l.startsWith("the final flush of the rollout records did not end within --run-timeout-s"))).toHaveLength(1);
    expect(collector.summary().records).toMatchObject({ records: 0, unwritten: 1 });
  });
});

describe("a failed run() with results.jsonl's sync hanging", () => {
  it("rejects within --run-timeout-s of its records flush, those rows counted as not written", { timeout: 15_000 }, async () => {
    const { url } = await rewardingRun();
    const { logger, lines } = capturingLogger();
    const rows = ["a", "b"].map((rolloutId) => ({ rolloutId, task: {} }));
    const collector = collectorIn(dir, url, idleController(), { rows, concurrency: 1, runTimeoutSeconds: 0.2, logger, records: records() });
    await collector.start();
    // a finishes (its record buffered); b's append fails (a full disk), and the sync before the
    // records flush that follows never ends.
    disk.failAppendOf = "b";
    disk.hangSyncs = true;
    await expect(collector.run()).rejects.toMatchObject({ code: "ENOSPC" });
    expect(disk.syncing).toBe(1);
    expect(lines.filter((l) => l.startsWith("the final flush of the rollout records did not end within --run-timeout-s"))).toHaveLength(1);
    expect(collector.summary().records).toMatchObject({ records: 0, unwritten: 1 });
     // A SIGINT's exit path meanwhile (halt, then flushRecords) does not wait a second --run-timeout-s
    // for the flush run() gave up, nor warn again.
    await collector.halt();
    await collector.flushRecords();
    expect(disk.syncing).toBe(1);
    expect(lines.filter((l) => l.startsWith("the final flush of the rollout records did not end within --run-timeout-s"))).toHaveLength(1);
    expect(collector.summary().records).toMatchObject({ records: 0, unwritten: 1 });
  });
});

describe("a failed run() with a results.jsonl append held by its storage", () => {
  // A line queued behind an append the failure gave up on, appended once that append returned,
  // would land after run() rejected: a next start could read --out without it, send its row again,
  // and then find it in --out twice.
  it("appends no line that had not begun its write, and says the one under way may still land", { timeout: 15_000 }, async () => {
    const { url } = await rewardingRun();
    let release!: () => void;
    disk.holdAppends = new Promise<void>((resolve) => (release = resolve));
    let failRead!: (error: Error) => void;
    const file = { path: join(dir, "tasks.jsonl"), read: () => new Promise<Buffer>((_, reject) => (failRead = reject)), close: async () => undefined } as unknown as TaskFile;
    const rows = [{ rolloutId: "a", task: {} }, { rolloutId: "b", task: {} }, { rolloutId: "c", task: new TaskLineRef(file, 1, 0, 2, "") }];
    const out = join(dir, "results.jsonl");
    const { logger, lines: logged } = capturingLogger();
    const collector = collectorIn(dir, url, idleController(), { rows, concurrency: 3, runTimeoutSeconds: 0.2, logger });
    await collector.start();
    const run = collector.run();
    run.catch(() => undefined);
    // One row's append is under way (held), the other's queued behind it; then c's task line read fails.
    await waitUntil(() => disk.appending === 1 && collector.summary().finished === 2, "one row's append under way, the other's queued");
    failRead(Object.assign(new Error("EIO: i/o error, read"), { code: "EIO" }));
    await expect(run).rejects.toThrow(/tasks file/);
    expect(collector.resultsWriteUnderWay).toBe(true);
    // A SIGINT's halt meanwhile decides nothing new: the write under way is said once.
    await collector.halt();
    expect(logged.filter((l) => l.startsWith("a results.jsonl line's write is under way"))).toHaveLength(1);
    release();
    await collector.resultsWriteEnded(); // what the command waits for before it lets go of the lock
    expect(collector.resultsWriteUnderWay).toBe(false);
    await resultAppendsSettled(out);
    const lines = (await readFile(out, "utf8")).split("\n").filter(Boolean).map((l) => (JSON.parse(l) as { rollout_id: string }).rollout_id);
    expect(lines).toHaveLength(1); // the write that had begun landed whole; the other had not begun, and never lands
  });
});

/** Whether `work` settles (either way) within `ms`: the bounds under test are far shorter. */
async function settlesWithin(work: Promise<unknown>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  return Promise.race([work.then(() => true, () => true), late]).finally(() => clearTimeout(timer));
}

describe("a collection that finished every row, with storage that hangs as it ends", () => {
  // The closes of a successful collection are bounded as a failure's or a halt's are: on a dead
  // mount the collector still ends, and lets go of its lock.
  it("results.jsonl's last sync hanging: fails storage_error (no summary: its rows may not be on disk) within --run-timeout-s, saying what it did not wait for", { timeout: 15_000 }, async () => {
    const { url } = await rewardingRun();
    const { logger, lines } = capturingLogger();
    const collector = collectorIn(dir, url, idleController(), { runTimeoutSeconds: 0.2, logger });
    await collector.start();
    disk.hangSyncs = true;
    const run = collector.run();
    expect(await settlesWithin(run, 10_000)).toBe(true);
    await expect(run).rejects.toMatchObject({ code: "storage_error", message: expect.stringContaining("did not end within --run-timeout-s") });
    expect(disk.syncing).toBe(1);
    expect(lines.filter((l) => l.startsWith("results.jsonl's sync as the collection ends did not end within --run-timeout-s"))).toHaveLength(1);
  });

  it("the records flush hanging (it syncs results.jsonl first): fails storage_error within --run-timeout-s of each, those rows counted as not written", { timeout: 15_000 }, async () => {
    const { url } = await rewardingRun();
    const { logger, lines } = capturingLogger();
    const collector = collectorIn(dir, url, idleController(), { runTimeoutSeconds: 0.2, logger, records: records() });
    await collector.start();
    disk.hangSyncs = true;
    const run = collector.run();
    expect(await settlesWithin(run, 10_000)).toBe(true);
    // The last sync of results.jsonl is queued behind the flush's, which never ends: not waited for either.
    await expect(run).rejects.toMatchObject({ code: "storage_error" });
    expect(lines.filter((l) => l.startsWith("the final flush of the rollout records did not end within --run-timeout-s"))).toHaveLength(1);
    expect(collector.summary().records).toMatchObject({ records: 0, unwritten: 1 });
  });

  it("the tasks file's close hanging: the summary within --run-timeout-s, with a warning, the collection's own outcome unchanged", { timeout: 15_000 }, async () => {
    const { url } = await rewardingRun();
    const { logger, lines } = capturingLogger();
    const text = "{}";
    const file = {
      path: join(dir, "tasks.jsonl"),
      read: async () => Buffer.from(text),
      close: () => new Promise<never>(() => undefined),
    } as unknown as TaskFile;
    const digest = createHash("sha256").update(text).digest("base64");
    const rows = [{ rolloutId: "a", task: new TaskLineRef(file, 1, 0, 2, digest) }];
    const collector = collectorIn(dir, url, idleController(), { rows, runTimeoutSeconds: 0.2, logger });
    await collector.start();
    disk.instantSyncs = true;
    const run = collector.run();
    expect(await settlesWithin(run, 10_000)).toBe(true);
    expect(await run).toMatchObject({ rows: 1, finished: 1, failed: 0 });
    expect(lines.filter((l) => l.startsWith("the tasks file's close did not end within --run-timeout-s as the collection ends"))).toHaveLength(1);
  });
});
