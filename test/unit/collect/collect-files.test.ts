import { appendFile, mkdtemp, readFile, rm, symlink, unlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { DispatchLog } from "../../../coordinator/collect/dispatch-log.js";
import { ProgressReporter, formatSeconds } from "../../../coordinator/collect/progress-reporter.js";
import { appendResult, readResults } from "../../../coordinator/collect/results-file.js";
import { closeTaskRows, loadTask, readTaskRows } from "../../../coordinator/collect/task-rows.js";
import { toCheckpointError } from "../../../protocol/index.js";

/** What `work` rejects with, as the CLI prints it (runCli). */
const refusalOf = async (work: Promise<unknown>) => toCheckpointError(await work.then(() => new Error("expected a failure"), (error: unknown) => error));

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collect-"));
});
afterEach(() => rm(dir, { recursive: true, force: true }));

describe("dispatch log", () => {
  it("keeps the run id and the latest attempt per rollout, ignoring a torn last line", async () => {
    const path = join(dir, "dispatched.jsonl");
    const log = await DispatchLog.create(path, "run-1", [{ rollout_id: "carried", attempt: 2 }]);
    await log.record({ rollout_id: "a", attempt: 0 });
    await log.record({ rollout_id: "a", attempt: 1 });
    await log.record({ rollout_id: "b", attempt: 0 });
    await appendFile(path, '{"rollout_id":"c","att');
    const history = await DispatchLog.read(path);
    expect(history?.runId).toBe("run-1");
    expect(Object.fromEntries(history!.latest)).toEqual({ carried: 2, a: 1, b: 0 });
  });

  it("names the run whose checkpoint this run restores (continues_run) in its first line, and reads a log without it", async () => {
    const path = join(dir, "dispatched.jsonl");
    await DispatchLog.create(path, "run-2", [], "run-1");
    expect((await readFile(path, "utf8")).split("\n")[0]).toBe('{"run_id":"run-2","continues_run":"run-1"}');
    expect(await DispatchLog.read(path)).toMatchObject({ runId: "run-2", continuesRun: "run-1" });
    await DispatchLog.create(path, "run-3");
    expect((await DispatchLog.read(path))?.continuesRun).toBeUndefined();
  });

  it("tells a restored attempt that was never sent from one that was", async () => {
    const path = join(dir, "dispatched.jsonl");
    const log = await DispatchLog.create(path, "run-1", [{ rollout_id: "carried", attempt: 3, restored: true }]);
    await log.recordRestored([{ rollout_id: "a", attempt: 1 }, { rollout_id: "b", attempt: 2 }]);
    await log.record({ rollout_id: "b", attempt: 2 });
    const history = await DispatchLog.read(path);
    expect(Object.fromEntries(history!.latest)).toEqual({ carried: 3, a: 1, b: 2 });
    expect([...history!.restoredOnly].sort()).toEqual(["a", "carried"]);
  });

  it("an append the disk refuses (a full disk: the log reaches /dev/full) is storage_error naming the log", async () => {
    const path = join(dir, "dispatched.jsonl");
    const log = await DispatchLog.create(path, "run-1");
    await unlink(path);
    await symlink("/dev/full", path); // ENOSPC on every write, for root too
    const refused = await refusalOf(log.record({ rollout_id: "a", attempt: 0 }));
    expect([refused.code, refused.message]).toEqual(["storage_error", `ENOSPC: no space left on device, write '${path}'`]);
  });

  it("is absent before the first run and refuses a corrupt middle line", async () => {
    expect(await DispatchLog.read(join(dir, "missing.jsonl"))).toBeUndefined();
    const path = join(dir, "bad.jsonl");
    await writeFile(path, '{"run_id":"r"}\n{"rollout_id":"a-a1","attempt":0}\n{"rollout_id":"b","attempt":0}\n');
    await expect(DispatchLog.read(path)).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("bad.jsonl:2:") });
    await writeFile(path, '{"run_id":"r"}\n{"rollout_id":"a",\n{"rollout_id":"b","attempt":0}\n');
    await expect(DispatchLog.read(path)).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("bad.jsonl:2:") });
    await writeFile(path, '{"run":"r"}\n');
    await expect(DispatchLog.read(path)).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("bad.jsonl:1:") });
  });
});

describe("results file", () => {
  it("round-trips finished rows and tolerates a torn append", async () => {
    const path = join(dir, "results.jsonl");
    await appendResult(path, { rollout_id: "a", attempt: 1, reward: 1, continued: true, finished_at: 1, response: { reward: 1 } });
    await appendFile(path, '{"rollout_id":"b"');
    const results = await readResults(path);
    expect([...results.keys()]).toEqual(["a"]);
    expect(results.get("a")?.continued).toBe(true);
  });

  it("streams long lines: a torn tail longer than one read chunk is found, and the replies stay in the file", async () => {
    const path = join(dir, "results.jsonl");
    for (const id of ["a", "b", "c"]) await appendResult(path, { rollout_id: id, attempt: 0, reward: 1, continued: false, finished_at: 1, response: { transcript: "x".repeat(100_000) } });
    await appendFile(path, `{"rollout_id":"d","attempt":0,"response":{"transcript":"${"y".repeat(150_000)}`);
    const results = await readResults(path);
    expect([...results.keys()]).toEqual(["a", "b", "c"]);
    expect(results.get("a")).toEqual({ rollout_id: "a", attempt: 0, reward: 1, continued: false, finished_at: 1 });
  });

  it("an append the disk refuses (--out on a full disk: here /dev/full) is storage_error naming --out", async () => {
    const path = join(dir, "results.jsonl");
    await symlink("/dev/full", path);
    const refused = await refusalOf(appendResult(path, { rollout_id: "a", attempt: 0, reward: 1, continued: false, finished_at: 1, response: {} }));
    expect([refused.code, refused.message]).toEqual(["storage_error", `ENOSPC: no space left on device, write '${path}'`]);
  });

  it("names the file and line of a corrupt middle line (invalid_checkpoint_state)", async () => {
    const path = join(dir, "results.jsonl");
    await writeFile(path, '{"rollout_id":"b"\n');
    await appendResult(path, { rollout_id: "a", attempt: 1, reward: 1, continued: true, finished_at: 1, response: { reward: 1 } });
    await expect(readResults(path)).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("results.jsonl:1:") });
  });
});

describe("task rows", () => {
  it("accepts bare tasks and id/task pairs, refusing duplicates and bad ids", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, '{"expression":"1 + 1"}\n\n{"id":"named","task":{"expression":"2 * 3"}}\n');
    const rows = await readTaskRows(path);
    expect(await Promise.all(rows.map(async (row) => ({ rolloutId: row.rolloutId, task: await loadTask(row) })))).toEqual([
      { rolloutId: "row-1", task: { expression: "1 + 1" } },
      { rolloutId: "named", task: { expression: "2 * 3" } },
    ]);
    await closeTaskRows(rows);
    await writeFile(path, '{"id":"x","task":{}}\n{"id":"x","task":{}}\n');
    await expect(readTaskRows(path)).rejects.toMatchObject({ code: "invalid_request" });
    await writeFile(path, '{"id":"x-a1","task":{}}\n');
    await expect(readTaskRows(path)).rejects.toMatchObject({ code: "invalid_request" });
  });
});

describe("progress", () => {
  it("prints plain lines at most once per interval off a TTY, and a live bar on one", () => {
    let now = 0;
    const written: string[] = [];
    const sink = { write: (s: string) => written.push(s), isTTY: false } as unknown as NodeJS.WritableStream;
    const plain = new ProgressReporter(sink, 1000, () => now);
    const snap = { total: 10, done: 5, doneBefore: 0, inFlight: 2, failed: 1, checkpoints: 1, lastCheckpointAt: 0 };
    now = 2000;
    plain.update(snap);
    now = 2500;
    plain.update(snap);
    expect(written).toHaveLength(1);
    expect(written[0]).toMatch(/5\/10 done, 2 in flight, 1 failed \| 2\.5 rows\/s, ETA 2s \| checkpoints 1, last 2s ago\n$/);

    const live: string[] = [];
    const tty = { write: (s: string) => live.push(s), isTTY: true } as unknown as NodeJS.WritableStream;
    const bar = new ProgressReporter(tty, 1000, () => now);
    bar.update(snap);
    bar.finish();
    expect(live[0]!.startsWith("\r[")).toBe(true);
    expect(live.at(-1)).toBe("\n");
    expect(formatSeconds(3725)).toBe("1h02m");
  });
});
