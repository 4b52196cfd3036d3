import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Command } from "commander";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { existsSync } from "node:fs";
import { register } from "../../../coordinator/cli/commands/collect.js";
import { COLLECTOR_LOCK_FILE } from "../../../coordinator/collect/collector-lock.js";
import { TaskFile } from "../../../coordinator/collect/task-file.js";
import { CheckpointError } from "../../../protocol/index.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * `gym-ckpt collect` in process, its collector a stand-in the test steers: an ending signal and the
 * collection's own end (its summary, or its failure) racing. One of them ends the process; the
 * other prints nothing and leaves the exit code alone. Both used to: a SIGTERM stop checkpoint given
 * up by a failing run() printed "exiting 75" beside the failure's error (exit 1), and a run() ending
 * after a Ctrl-C's halt printed its summary beside the exit 130.
 */
const steer = vi.hoisted(() => ({
  run: undefined as unknown as { promise: Promise<unknown>; resolve: (v: unknown) => void; reject: (e: unknown) => void },
  stop: undefined as unknown as { promise: Promise<unknown>; resolve: (v: unknown) => void },
  ended: false,
  running: false,
  meanAsked: false,
  halted: 0,
  stopAsked: 0,
  /** When set, halt() waits for it: a halt whose appends or tasks file's close take a while. */
  haltHeld: undefined as undefined | Promise<unknown>,
  flushed: 0,
  /** What summary().records says: rows whose records the final flush did not write. */
  unwritten: 0,
  /** What resultsWriteUnderWay says: a results.jsonl line's write given up but begun. */
  writeUnderWay: false,
  /** What resultsWriteEnded() returns: settles once that write has returned. */
  writeEnded: undefined as unknown as { promise: Promise<void>; resolve: (v: void) => void },
}));
vi.mock("../../../coordinator/collect/collector.js", async (importOriginal) => {
  const original = await importOriginal<typeof import("../../../coordinator/collect/collector.js")>();
  class SteeredCollector {
    get hasEnded() {
      return steer.ended;
    }
    get resultsWriteUnderWay() {
      return steer.writeUnderWay;
    }
    resultsWriteEnded() {
      return steer.writeEnded.promise;
    }
    async start() {}
    run() {
      steer.running = true;
      return steer.run.promise;
    }
    checkpoint({ stop }: { stop: boolean }) {
      if (!stop) return Promise.resolve({ published: false, checkpointId: "" });
      steer.stopAsked++;
      return steer.stop.promise;
    }
    async halt() {
      steer.halted++;
      await steer.haltHeld;
    }
    async flushRecords() {
      steer.flushed++;
    }
    async meanReward() {
      steer.meanAsked = true;
      return 1;
    }
    summary() {
      return { ...SUMMARY, records: { records: 0, steps: 0, skipped: 0, failedFlushes: 1, unwritten: steer.unwritten } };
    }
  }
  return { ...original, Collector: SteeredCollector };
});

const SUMMARY = { rows: 2, finished: 1, failed: 0, checkpoints: 0, continued: 0, restarted: 0, stopped: true, failedRows: [], usage: { modelCallsKept: 0, tokensKept: 0, modelCallsRegenerated: 0, tokensRegenerated: 0 } };

function settable<T>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => ((resolve = res), (reject = rej)));
  promise.catch(() => undefined);
  return { promise, resolve, reject };
}

let dir: string;
let stderr: string;
let stdout: string;
let exits: (number | undefined)[];
const signals = ["SIGUSR1", "SIGTERM", "SIGINT", "SIGHUP"] as const;
let before: Map<string, Function[]>;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collect-exit-owner-"));
  await writeFile(join(dir, "tasks.jsonl"), '{"id":"a","task":{}}\n{"id":"b","task":{}}\n');
  stderr = "";
  stdout = "";
  exits = [];
  steer.run = settable<unknown>();
  steer.stop = settable<unknown>();
  steer.ended = false;
  steer.running = false;
  steer.meanAsked = false;
  steer.halted = 0;
  steer.stopAsked = 0;
  steer.haltHeld = undefined;
  steer.flushed = 0;
  steer.unwritten = 0;
  steer.writeUnderWay = false;
  steer.writeEnded = settable<void>();
  vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => ((stderr += String(chunk)), true));
  vi.spyOn(process.stdout, "write").mockImplementation((chunk: string | Uint8Array) => ((stdout += String(chunk)), true));
  vi.spyOn(process, "exit").mockImplementation(((code?: number) => void exits.push(code)) as typeof process.exit);
  before = new Map(signals.map((s) => [s, process.listeners(s)]));
  process.exitCode = undefined;
});
afterEach(async () => {
  vi.restoreAllMocks();
  for (const s of signals) for (const l of process.listeners(s)) if (!before.get(s)!.includes(l)) process.off(s, l as () => void);
  process.exitCode = undefined;
  await rm(dir, { recursive: true, force: true });
});

/** Starts the command; resolves once its action has returned. */
function collect(): Promise<void> {
  const program = new Command().exitOverride();
  register(program);
  const argv = ["collect", "--tasks", join(dir, "tasks.jsonl"), "--out", join(dir, "results.jsonl"), "--checkpoint-dir", join(dir, "ckpt"), "--run-url", "http://127.0.0.1:2/run", "--http-url", "http://127.0.0.1:2", "--token", "t"];
  return program.parseAsync(argv, { from: "user" }).then(() => undefined);
}

/** Both paths have had their say: the action returned and, when a signal ends the process, it called exit. */
async function settled(action: Promise<void>, signalExits: boolean): Promise<void> {
  await action;
  if (signalExits) await waitUntil(() => exits.length > 0, "the signal's exit");
  // Anything still queued behind them (a second path's output) lands before the checks.
  await new Promise((resolve) => setImmediate(resolve));
}

describe("gym-ckpt collect: one outcome when a signal and the collection's end race", () => {
  it.each(["checkpoint given up first", "run() rejected first"])(
    "a SIGTERM's stop checkpoint given up because run() failed (%s): the failure is the outcome, exit 1, no 'exiting 75'",
    async (order) => {
      const action = collect();
      await waitUntil(() => steer.running, "the collection running");
      process.emit("SIGTERM");
      await waitUntil(() => steer.stopAsked === 1, "the stop checkpoint asked for");
      // run() fails: the collection has ended, and the stop checkpoint under way is given up, not published.
      steer.ended = true;
      const failure = new CheckpointError("storage_error", "results.jsonl could not be synced");
      if (order === "checkpoint given up first") {
        steer.stop.resolve({ published: false, checkpointId: "20261207T000000Z-given-up" });
        await new Promise((resolve) => setImmediate(resolve));
        steer.run.reject(failure);
      } else {
        steer.run.reject(failure);
        await new Promise((resolve) => setImmediate(resolve));
        steer.stop.resolve({ published: false, checkpointId: "20261207T000000Z-given-up" });
      }
      await settled(action, false);
      expect(stderr).toContain("error storage_error: results.jsonl could not be synced\n");
      expect(stderr).not.toContain("exiting 75");
      expect(exits).toEqual([]);
      expect(process.exitCode).toBe(1);
    },
  );

  it("a SIGTERM whose stop checkpoint is published while run() ends (nothing in flight): exit 75, no summary", async () => {
    const action = collect();
    await waitUntil(() => steer.running, "the collection running");
    process.emit("SIGTERM");
    await waitUntil(() => steer.stopAsked === 1, "the stop checkpoint asked for");
    steer.run.resolve(SUMMARY); // the workers came back as the stop was published
    await new Promise((resolve) => setImmediate(resolve));
    steer.stop.resolve({ published: true, checkpointId: "20261207T000000Z-stop" });
    await settled(action, true);
    expect(exits).toEqual([75]);
    expect(stderr).toContain("stopped: checkpoint 20261207T000000Z-stop published; exiting 75");
    expect(stdout).toBe("");
    expect(process.exitCode).toBeUndefined();
  });

  it("Ctrl-C, then run() ends normally (its halt left nothing to send): exit 130, no summary", async () => {
    const action = collect();
    await waitUntil(() => steer.running, "the collection running");
    process.emit("SIGINT");
    await waitUntil(() => steer.halted === 1, "the halt");
    steer.run.resolve(SUMMARY);
    await settled(action, true);
    expect(exits).toEqual([130]);
    expect(stdout).toBe("");
    expect(process.exitCode).toBeUndefined();
  });

  it("Ctrl-C, then run() fails: exit 130, its error not printed", async () => {
    const action = collect();
    await waitUntil(() => steer.running, "the collection running");
    process.emit("SIGINT");
    await waitUntil(() => steer.halted === 1, "the halt");
    steer.run.reject(new CheckpointError("storage_error", "results.jsonl could not be synced"));
    await settled(action, true);
    expect(exits).toEqual([130]);
    expect(stderr).not.toContain("error storage_error");
    expect(process.exitCode).toBeUndefined();
  });

  it("a SIGINT once the summary is on its way: ignored, the collection's own code", async () => {
    const action = collect();
    await waitUntil(() => steer.running, "the collection running");
    steer.ended = true;
    steer.run.resolve(SUMMARY);
    await waitUntil(() => steer.meanAsked, "the summary being made");
    process.emit("SIGINT");
    await settled(action, false);
    expect(steer.halted).toBe(0);
    expect(exits).toEqual([]);
    expect(stdout).toContain("rows: 2 (finished 1, failed 0)");
    expect(process.exitCode).toBe(1); // a row not finished
  });

  // The first exit under way owns the outcome: a later SIGINT or SIGHUP only cuts its halt and flush
  // short. One after the stop checkpoint's "exiting 75" started a second halt and flush: both
  // printed the "not written" line, and 75 and 130 (or a hangup) raced.
  it.each(["SIGINT", "SIGHUP"] as const)(
    "a SIGTERM's stop checkpoint published and 'exiting 75' printed, then %s during the halt that follows: exit 75 at once, no second halt, one 'not written' line at most",
    async (later) => {
      const kills: unknown[] = [];
      vi.spyOn(process, "kill").mockImplementation((pid, signal) => (kills.push([pid, signal]), true));
      let endHalt!: () => void;
      steer.haltHeld = new Promise<void>((resolve) => (endHalt = resolve));
      steer.unwritten = 2;
      const action = collect();
      await waitUntil(() => steer.running, "the collection running");
      process.emit("SIGTERM");
      await waitUntil(() => steer.stopAsked === 1, "the stop checkpoint asked for");
      steer.stop.resolve({ published: true, checkpointId: "20261207T000000Z-stop" });
      await waitUntil(() => steer.halted === 1, "the halt after the stop checkpoint");
      expect(stderr).toContain("stopped: checkpoint 20261207T000000Z-stop published; exiting 75");
      process.emit(later);
      await waitUntil(() => exits.length > 0, "the exit cut short");
      expect(exits).toEqual([75]);
      // The halt ends after all: the first path, overtaken, neither reports nor exits again.
      endHalt();
      await waitUntil(() => steer.flushed >= 1, "the first path's flush");
      steer.run.resolve(SUMMARY);
      await settled(action, true);
      expect(exits).toEqual([75]);
      expect(kills).toEqual([]);
      expect(steer.halted).toBe(1);
      expect(stderr.split("finished rows not written").length - 1).toBeLessThanOrEqual(1);
      expect(stdout).toBe("");
      expect(process.exitCode).toBeUndefined();
    },
  );

  it("Ctrl-C twice, the second during the first one's halt: exit 130 once, one halt, one 'not written' line at most", async () => {
    let endHalt!: () => void;
    steer.haltHeld = new Promise<void>((resolve) => (endHalt = resolve));
    steer.unwritten = 2;
    const action = collect();
    await waitUntil(() => steer.running, "the collection running");
    process.emit("SIGINT");
    await waitUntil(() => steer.halted === 1, "the halt");
    process.emit("SIGINT");
    await waitUntil(() => exits.length > 0, "the exit cut short");
    endHalt();
    await waitUntil(() => steer.flushed >= 1, "the first path's flush");
    steer.run.resolve(SUMMARY);
    await settled(action, true);
    expect(exits).toEqual([130]);
    expect(steer.halted).toBe(1);
    expect(stderr.split("finished rows not written").length - 1).toBeLessThanOrEqual(1);
    expect(stdout).toBe("");
  });

  // run() gives up a worker its storage holds in a task line read (a dead mount) after
  // --run-timeout-s, and does not wait for the tasks file's close, which waits for that read
  // (FileHandle.close). The release on the way out closed the same file and waited for it: the lock
  // was never let go and the error never printed, for as long as the read hung.
  it("run() fails while the tasks file's close waits for a read that hangs: the error is printed, exit 1, and the lock released without waiting for the close", async () => {
    const realClose = TaskFile.prototype.close;
    let endRead!: () => void;
    const readEnds = new Promise<void>((resolve) => (endRead = resolve));
    vi.spyOn(TaskFile.prototype, "close").mockImplementation(function (this: TaskFile) {
      return readEnds.then(() => realClose.call(this));
    });
    try {
      const action = collect();
      await waitUntil(() => steer.running, "the collection running");
      steer.ended = true;
      steer.run.reject(new CheckpointError("storage_error", "dispatched.jsonl could not be appended"));
      await waitUntil(() => stderr.includes("error storage_error: dispatched.jsonl could not be appended\n"), "the error printed");
      await action;
      expect(process.exitCode).toBe(1);
      expect(existsSync(join(dir, "ckpt", COLLECTOR_LOCK_FILE))).toBe(false);
      expect(exits).toEqual([]);
    } finally {
      endRead(); // the read ends after all: the file closes
    }
  });

  // A results.jsonl line the failure gave up on whose write had begun may still land. Releasing the
  // lock let a next start read --out before it did, send its row again, and have it there twice.
  it("run() fails while a results.jsonl line's write is under way: the error is printed, exit 1, and collector.pid is kept naming this process", async () => {
    const action = collect();
    await waitUntil(() => steer.running, "the collection running");
    steer.ended = true;
    steer.writeUnderWay = true;
    steer.run.reject(new CheckpointError("storage_error", "dispatched.jsonl could not be appended"));
    await action;
    expect(stderr).toContain("error storage_error: dispatched.jsonl could not be appended\n");
    expect(process.exitCode).toBe(1);
    expect(existsSync(join(dir, "ckpt", COLLECTOR_LOCK_FILE))).toBe(true);
    // The write returns while the process is still there (a failed collection sets its exit code
    // and ends when nothing is left to wait for): the lock is let go then, not left for a take-over.
    steer.writeUnderWay = false;
    steer.writeEnded.resolve();
    await waitUntil(() => !existsSync(join(dir, "ckpt", COLLECTOR_LOCK_FILE)), "collector.pid removed once the write returned");
  });
});
