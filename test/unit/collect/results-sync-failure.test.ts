import { createHash } from "node:crypto";
import { mkdtemp, readFile, readdir, rm } from "node:fs/promises";
import { createServer, type Server } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { appendResult, readResultsForAppend, syncResults } from "../../../coordinator/collect/results-file.js";
import { collectorIn, idleController } from "../../support/collector-fixture.js";
import type { TaskFile } from "../../../coordinator/collect/task-file.js";
import { TaskLineRef } from "../../../coordinator/collect/task-rows.js";

/**
 * A failed fdatasync of results.jsonl (EIO) is reported once: Linux marks the pages whose writeback
 * failed clean and tells only the descriptor that synced, so a later sync on a new descriptor
 * succeeds although those lines never reached the disk (they still read back, from the page cache,
 * until a power loss). The fake below fails `disk.failSyncs` datasyncs of `results.jsonl` that way:
 * without syncing, and the next one succeeds.
 */
const disk = vi.hoisted(() => ({ failSyncs: 0, syncs: 0, failAt: 0, failTruncate: false, dir: "", dirSyncs: 0, hangAt: 0, hang: Promise.resolve() }));

vi.mock("node:fs/promises", async (importOriginal) => {
  const { handleWith, withOverrides } = await import("../../support/fs-mock.js");
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const open: typeof real.open = async (path, flags, mode) => {
    const handle = await real.open(path, flags, mode);
    if (String(path) === disk.dir) {
      const sync = handle.sync.bind(handle);
      handle.sync = async () => {
        await sync();
        disk.dirSyncs++;
      };
      return handle;
    }
    if (!String(path).endsWith("results.jsonl")) return handle;
    const faultySync = (sync: () => Promise<void>) => async () => {
      disk.syncs++;
      if (disk.syncs === disk.hangAt) await disk.hang; // a mount that stops answering
      if (disk.failSyncs > 0 || disk.syncs === disk.failAt) {
        if (disk.failSyncs > 0) disk.failSyncs--;
        throw Object.assign(new Error("EIO: i/o error, fdatasync"), { code: "EIO", syscall: "fdatasync" });
      }
      await sync();
    };
    return handleWith(handle, {
      truncate: async (len?: number) => (disk.failTruncate ? Promise.reject(Object.assign(new Error("EIO: i/o error, ftruncate"), { code: "EIO", syscall: "ftruncate" })) : handle.truncate(len)),
      datasync: faultySync(() => handle.datasync()),
      sync: faultySync(() => handle.sync()),
    });
  };
  return withOverrides(real, { open });
});

let dir: string;
let server: Server | undefined;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-results-sync-"));
  Object.assign(disk, { failSyncs: 0, syncs: 0, failAt: 0, failTruncate: false, dir, dirSyncs: 0, hangAt: 0, hang: Promise.resolve() });
});
afterEach(async () => {
  server?.closeAllConnections();
  server?.close();
  server = undefined;
  await rm(dir, { recursive: true, force: true });
});

const line = (rollout_id: string) => ({ rollout_id, attempt: 0, reward: 1, continued: false, finished_at: 1, response: {} });
const idsIn = async (path: string) =>
  (await readFile(path, "utf8"))
    .split("\n")
    .filter(Boolean)
    .map((l) => (JSON.parse(l) as { rollout_id: string }).rollout_id);

/** A /run server answering every row with reward 1; its URL. */
async function rewardingRun(): Promise<string> {
  server = createServer((req, res) => {
    req.resume();
    req.on("end", () => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1 })));
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
}

describe("a collection without --records-dir", () => {
  const rows = ["r0", "r1"].map((rolloutId) => ({ rolloutId, task: {} }));

  it("syncs results.jsonl (and its directory) before it ends with its summary: exit 0 means the rows are on disk", async () => {
    const collector = collectorIn(dir, await rewardingRun(), idleController(), { rows });
    await collector.start();
    expect(disk.syncs).toBe(0); // no file yet: the start had nothing to sync
    expect(await collector.run()).toMatchObject({ finished: 2 });
    expect(disk.syncs).toBe(2); // the empty file made before the first /run, and the end's
    expect(disk.dirSyncs).toBeGreaterThanOrEqual(1);
  });

  it("whose final sync fails ends with storage_error, not a summary, and the next start runs the rows cut again", async () => {
    const url = await rewardingRun();
    const first = collectorIn(dir, url, idleController(), { rows });
    await first.start();
    disk.failAt = disk.syncs + 2; // the end's (the first makes the empty file)
    await expect(first.run()).rejects.toMatchObject({ code: "storage_error" });
    expect(await idsIn(join(dir, "results.jsonl"))).toEqual([]);
    disk.failAt = 0;
    const second = collectorIn(dir, url, idleController(), { rows });
    await second.start();
    expect(await second.run()).toMatchObject({ finished: 2 });
    expect([...(await idsIn(join(dir, "results.jsonl")))].sort()).toEqual(["r0", "r1"]);
  });
});

describe("a failed sync of results.jsonl", () => {
  it("is never followed by a sync that reports success, and the lines since the last good sync are cut off, not trusted", async () => {
    const out = join(dir, "results.jsonl");
    await readResultsForAppend(out);
    await appendResult(out, line("a"));
    await syncResults(out);
    await appendResult(out, line("b"));
    await appendResult(out, line("c"));
    disk.failSyncs = 1;
    await expect(syncResults(out)).rejects.toMatchObject({ code: "storage_error" });
    // The kernel would answer this one with success: b and c read back, but may never reach the disk.
    await expect(syncResults(out)).rejects.toMatchObject({ code: "storage_error" });
    // Nothing lands after them either: its success could not be known.
    await expect(appendResult(out, line("d"))).rejects.toMatchObject({ code: "storage_error" });
    // What reads back is what was synced: a start takes b and c for unfinished and runs them again.
    expect(await idsIn(out)).toEqual(["a"]);
    expect([...(await readResultsForAppend(out)).keys()]).toEqual(["a"]);
  });

  it("the first sync of a file made since the start syncs its directory too: before, the file itself could vanish in a power loss", async () => {
    const out = join(dir, "results.jsonl");
    await readResultsForAppend(out);
    await appendResult(out, line("a"));
    expect(disk.dirSyncs).toBe(0);
    await syncResults(out);
    expect(disk.dirSyncs).toBe(1);
    await appendResult(out, line("b"));
    await syncResults(out);
    expect(disk.dirSyncs).toBe(1);
  });

  it("when even the cut fails, says so, and no start in this process reads the file as it is", async () => {
    const out = join(dir, "results.jsonl");
    await readResultsForAppend(out);
    await appendResult(out, line("a"));
    disk.failSyncs = 1;
    disk.failTruncate = true;
    await expect(syncResults(out)).rejects.toThrow(/failed too/);
    disk.failTruncate = false;
    await expect(readResultsForAppend(out)).rejects.toMatchObject({ code: "storage_error" });
  });

  it("a start whose sync of the file it read fails is refused: lines an earlier run left may not be on disk", async () => {
    const out = join(dir, "results.jsonl");
    await appendResult(out, line("a"));
    disk.failSyncs = 1;
    await expect(readResultsForAppend(out)).rejects.toMatchObject({ code: "storage_error" });
  });

  // Sync 1 makes the empty file before the first /run (the baseline: 0 bytes). Sync 2 comes before
  // r0's step: failing, it cuts every line. Sync 3 fails after sync 2 put r0's line (at least) on disk.
  it.each([2, 3])("stops the collection (storage_error) when sync %i fails, publishing no record of a row cut from --out; the restart runs the cut rows again and --out and the records hold every row once", async (failAt) => {
    const trajectory = { task_name: null, prompt: null, nodes: [], reward: 1, turns: 0, stop_condition: null, is_completed: true, replay: null };
    const runs: string[] = [];
    server = createServer((req, res) => {
      let body = "";
      req.on("data", (chunk: Buffer) => (body += chunk.toString()));
      req.on("end", () => {
        runs.push((JSON.parse(body) as { rollout_id: string }).rollout_id);
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1, trajectory }));
      });
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    const rows = ["r0", "r1", "r2", "r3", "r4"].map((rolloutId) => ({ rolloutId, task: {} }));
    const options = { rows, concurrency: 1, records: { dir: join(dir, "records"), env: "gym", kind: "eval" as const, everyRows: 1, everySeconds: 600 } };
    const out = join(dir, "results.jsonl");
    const recorded = async () => {
      const ids: string[] = [];
      const root = join(dir, "records", "rollouts");
      for (const step of await readdir(root)) {
        for (const file of await readdir(join(root, step))) {
          if (!file.endsWith("_rollouts_gym.jsonl")) continue;
          for (const l of (await readFile(join(root, step, file), "utf8")).split("\n").filter(Boolean)) ids.push((JSON.parse(l) as { info: { rollout_id: string } }).info.rollout_id);
        }
      }
      return ids;
    };

    disk.failAt = failAt;
    const first = collectorIn(dir, url, idleController(), options);
    await first.start();
    await expect(first.run()).rejects.toMatchObject({ code: "storage_error" });
    // Every published record's row is in the file (synced before it); no row is recorded twice.
    const kept = await idsIn(out);
    const published = await recorded();
    expect(published.every((id) => kept.includes(id))).toBe(true);
    expect(new Set(kept).size).toBe(kept.length);
    if (failAt === 2) expect(kept).toEqual([]);
    else expect(kept[0]).toBe("r0");
    // The rows the last good sync covered keep their records (written by the final flush).
    expect([...published].sort()).toEqual([...kept].sort());

    disk.failAt = 0;
    const second = collectorIn(dir, url, idleController(), options);
    await second.start();
    expect(await second.run()).toMatchObject({ finished: rows.length });
    const ids = await idsIn(out);
    expect([...ids].sort()).toEqual(rows.map((r) => r.rolloutId));
    expect([...(await recorded())].sort()).toEqual(rows.map((r) => r.rolloutId));
    // The rows cut from the file ran again; none that stayed in it did.
    for (const id of kept) expect(runs.filter((r) => r === id)).toHaveLength(1);
  });
});

// A failed sync stops the collection (halted) but gave up our checkpoint under way (`leaving`)
// only once every worker was back, and one its storage holds (a task line on a dead mount) is not
// back for up to --run-timeout-s (since run() stops waiting for them at the failure, next describe,
// `leaving` follows the halt at once; the check stays). A checkpoint taking its turn meanwhile found its retires cut short
// by the halt, attempts still queued for retire, and went on to prepare: those failed attempts'
// episodes, not retired, were held parked and asked to capture, for a checkpoint given up next.
describe("a failed sync while retires are queued", () => {
  it("gives our checkpoint up before its prepare: no attempt of a failed row is asked to capture unretired", { timeout: 10_000 }, async () => {
    const trajectory = { task_name: null, prompt: null, nodes: [], reward: 1, turns: 0, stop_condition: null, is_completed: true, replay: null };
    const answers = new Map<string, (status: number, body: unknown) => void>();
    server = createServer((req, res) => {
      let body = "";
      req.on("data", (chunk: Buffer) => (body += chunk.toString()));
      req.on("end", () => {
        const { rollout_id } = JSON.parse(body) as { rollout_id: string };
        answers.set(rollout_id, (status, reply) => res.writeHead(status, { "content-type": "application/json" }).end(JSON.stringify(reply)));
      });
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    // h's line is read from a tasks file whose read hangs (a dead mount) until the test ends: its worker keeps the failure from `leaving`.
    let endRead!: () => void;
    const readEnds = new Promise<void>((resolve) => (endRead = resolve));
    const hung = { path: join(dir, "tasks.jsonl"), read: () => readEnds.then(() => Buffer.from("{}")), close: async () => undefined } as unknown as TaskFile;
    const rows = [{ rolloutId: "h", task: new TaskLineRef(hung, 1, 0, 2, createHash("sha256").update("{}").digest("base64")) }, ...["f1", "f2", "ok"].map((rolloutId) => ({ rolloutId, task: {} }))];
    const ops: string[] = [];
    let releaseRetire!: () => void;
    const retireHeld = new Promise<void>((resolve) => (releaseRetire = resolve));
    const controller = idleController({
      retire: async (req: { episode_ids: { rollout_id: string }[] }) => {
        ops.push(`retire:${req.episode_ids.map((e) => e.rollout_id).join(",")}`);
        await retireHeld;
        return { participants: [] };
      },
      prepare: async () => {
        ops.push("prepare");
        return { prepared: true, blockers: [], restarts: [], stopped_at: null };
      },
      resume: async () => (ops.push("resume"), {}),
    });
    const options = { rows, concurrency: 4, runTimeoutSeconds: 1, records: { dir: join(dir, "records"), env: "gym", kind: "eval" as const, everyRows: 1, everySeconds: 600 } };
    const lines: string[] = [];
    const logger = pino({ level: "warn" }, { write: (line: string) => void lines.push((JSON.parse(line) as { msg: string; rollout_id?: string }).msg + ` ${(JSON.parse(line) as { rollout_id?: string }).rollout_id ?? ""}`) });
    const collector = collectorIn(dir, url, controller, { ...options, logger });
    await collector.start();
    const run = collector.run();
    await vi.waitFor(() => expect(answers.size).toBe(3), { timeout: 5000 });
    // f1 fails: its retire is sent and held. f2 fails meanwhile: its attempt waits in the queue.
    answers.get("f1")!(500, { error: "boom" });
    await vi.waitFor(() => expect(ops).toEqual(["retire:f1"]), { timeout: 5000 });
    answers.get("f2")!(500, { error: "boom" });
    await vi.waitFor(() => expect(lines).toContain("/run failed; the row is sent again f2"), { timeout: 5000 });
    // A SIGTERM: the stop checkpoint waits for the lock the retire holds.
    const stop = collector.checkpoint({ stop: true });
    // ok finishes; the sync before its records step fails (sync 1 made the empty file): the collection stops.
    disk.failAt = disk.syncs + 1;
    answers.get("ok")!(200, { reward: 1, trajectory });
    await vi.waitFor(() => expect(lines.some((l) => l.startsWith("results.jsonl could not be synced; the collection stops"))).toBe(true), { timeout: 5000 });
    releaseRetire();
    const stopped = await stop.catch((error: unknown) => error);
    expect(ops).not.toContain("prepare");
    expect(stopped).toMatchObject({ published: false });
    endRead();
    await expect(run).rejects.toMatchObject({ code: "storage_error" });
  });
});

// A failed sync stops the collection from the records step, not from a worker: every worker is
// woken and returns, but one its storage holds (its task line read from a dead mount) never does.
// run() waited for it with no bound (Promise.all over the workers before any failure handling), and
// its close of the tasks file waited for that read too (a FileHandle's close waits for its reads).
describe("a failed sync while a worker's task line read never ends", () => {
  it("rejects within --run-timeout-s, says the worker was given up, and sends nothing after it", { timeout: 10_000 }, async () => {
    const trajectory = { task_name: null, prompt: null, nodes: [], reward: 1, turns: 0, stop_condition: null, is_completed: true, replay: null };
    const requests: string[] = [];
    server = createServer((req, res) => {
      let body = "";
      req.on("data", (chunk: Buffer) => (body += chunk.toString()));
      req.on("end", () => {
        requests.push((JSON.parse(body) as { rollout_id: string }).rollout_id);
        res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1, trajectory }));
      });
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    // h's read never ends while the test asserts the rejection (released only afterwards, to see
    // that nothing follows it); its file's close waits for it, as FileHandle.close does.
    let endRead!: () => void;
    const readEnds = new Promise<void>((resolve) => (endRead = resolve));
    const hung = { path: join(dir, "tasks.jsonl"), read: () => readEnds.then(() => Buffer.from("{}")), close: () => readEnds } as unknown as TaskFile;
    const rows = [{ rolloutId: "h", task: new TaskLineRef(hung, 1, 0, 2, createHash("sha256").update("{}").digest("base64")) }, { rolloutId: "ok", task: {} }];
    const lines: string[] = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push((JSON.parse(line) as { msg: string }).msg) });
    const options = { rows, concurrency: 2, runTimeoutSeconds: 0.5, logger, records: { dir: join(dir, "records"), env: "gym", kind: "eval" as const, everyRows: 1, everySeconds: 600 } };
    const collector = collectorIn(dir, url, idleController(), options);
    await collector.start();
    // Sync 1 makes the empty file; sync 2, before ok's records step, fails: the collection stops.
    disk.failAt = disk.syncs + 2;
    await expect(collector.run()).rejects.toMatchObject({ code: "storage_error" });
    expect(lines.some((l) => l.startsWith("results.jsonl could not be synced; the collection stops"))).toBe(true);
    expect(lines.filter((l) => l.startsWith("a worker did not come back within --run-timeout-s")).length).toBe(1);
    expect(requests).toEqual(["ok"]);
    // The read ends after all: its worker sees the collection failed and sends, logs and appends nothing.
    const logged = lines.length;
    endRead();
    await readEnds;
    for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve));
    expect(requests).toEqual(["ok"]);
    expect(lines.slice(logged)).toEqual([]);
    expect(await idsIn(join(dir, "results.jsonl"))).toEqual([]);
  });
});

// --out on a mount that stops answering: the sync before a records step hangs. Another row's failure
// then fails the collection. drained() is bounded by --run-timeout-s, but run() then closed the
// rollout records and waited for that, and their final flush waits for the step whose sync hangs:
// run() never rejected (nor, in the command, let go of the lock).
describe("a collection failing while the sync before a records step hangs", () => {
  it("rejects within --run-timeout-s, without waiting for the records' final flush, and publishes no step after it", { timeout: 10_000 }, async () => {
    const trajectory = { task_name: null, prompt: null, nodes: [], reward: 1, turns: 0, stop_condition: null, is_completed: true, replay: null };
    const answers = new Map<string, () => void>();
    server = createServer((req, res) => {
      let body = "";
      req.on("data", (chunk: Buffer) => (body += chunk.toString()));
      req.on("end", () => {
        const { rollout_id } = JSON.parse(body) as { rollout_id: string };
        answers.set(rollout_id, () => res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ reward: 1, trajectory })));
      });
    });
    await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
    const url = `http://127.0.0.1:${(server.address() as { port: number }).port}/run`;
    // x's line is read once the test says so, and reads back changed: its worker fails the collection.
    let readX!: () => void;
    const xRead = new Promise<void>((resolve) => (readX = resolve));
    const changed = { path: join(dir, "tasks.jsonl"), read: () => xRead.then(() => Buffer.from('{"b":1}')), close: async () => undefined } as unknown as TaskFile;
    const rows = [{ rolloutId: "x", task: new TaskLineRef(changed, 1, 0, 2, createHash("sha256").update("{}").digest("base64")) }, { rolloutId: "ok", task: {} }];
    let endHang!: () => void;
    disk.hang = new Promise<void>((resolve) => (endHang = resolve));
    const lines: string[] = [];
    const logger = pino({ level: "warn" }, { write: (line: string) => void lines.push((JSON.parse(line) as { msg: string }).msg) });
    const records = join(dir, "records");
    const options = { rows, concurrency: 2, runTimeoutSeconds: 0.5, logger, records: { dir: records, env: "gym", kind: "eval" as const, everyRows: 1, everySeconds: 600 } };
    const collector = collectorIn(dir, url, idleController(), options);
    await collector.start();
    // Sync 1 makes the empty file; sync 2, before ok's records step, hangs.
    disk.hangAt = disk.syncs + 2;
    const run = collector.run();
    run.catch(() => undefined);
    await vi.waitFor(() => expect(answers.size).toBe(1), { timeout: 5000 });
    answers.get("ok")!();
    await vi.waitFor(() => expect(disk.syncs).toBe(disk.hangAt), { timeout: 5000 });
    readX();
    try {
      const outcome = await Promise.race([run.then(() => "resolved", (error: unknown) => error), new Promise((resolve) => setTimeout(() => resolve("still waiting"), 3000))]);
      expect(outcome).toMatchObject({ code: "invalid_request" });
    } finally {
      endHang();
    }
    // The mount answers again: no records step is published after run() rejected (the sink's
    // flush under way, its private tail, has ended once this settles).
    const sink = (collector as unknown as { records: { tail: Promise<void> } }).records;
    await sink.tail.catch(() => undefined);
    // (rollouts/ itself is made at the start.)
    const steps = await readdir(join(records, "rollouts")).catch(() => [] as string[]);
    expect(steps.filter((f) => !f.startsWith("."))).toEqual([]);
  });
});
