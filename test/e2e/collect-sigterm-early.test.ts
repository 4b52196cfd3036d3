import { execFileSync } from "node:child_process";
import { constants, existsSync, readdirSync } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { pausedPackageLoad } from "../support/paused-package-load.js";
import type { ChildProgram } from "../../coordinator/local/child-program.js";
import type { GymWorld } from "../support/gym-processes.js";
import { collectHarness } from "./collect-processes.js";

/**
 * A SIGTERM (or SIGINT) that reaches `gym-ckpt collect` before its own handlers exist: while its
 * modules load, or while it reads --tasks. Node's default action would kill it at once (a signal
 * death, not the documented 75 a scheduler requeues on). Nothing is started or held yet, so a
 * SIGTERM ends the start-up at once with 75, leaving nothing behind, even while it reads a --tasks
 * that never delivers (a scheduler waits its grace period, then SIGKILLs). A SIGINT still ends it
 * at once by the signal. A FIFO that delivers is read as a file is.
 */
const { setUp, startCollector, finishCleanly } = collectHarness();

async function writerOnceRead(fifo: string): Promise<FileHandle | undefined> {
  return open(fifo, constants.O_WRONLY | constants.O_NONBLOCK).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENXIO") return undefined;
    throw error;
  });
}

/** An empty FIFO in the world's root, for --tasks. */
function tasksFifo(w: GymWorld): string {
  const fifo = join(w.root, "tasks.fifo");
  execFileSync("mkfifo", [fifo]);
  return fifo;
}

/** The writer's end of `fifo`, once the collector has opened it for reading. */
async function writerOnceReading(w: GymWorld, fifo: string): Promise<FileHandle> {
  let writer: FileHandle | undefined;
  await w.waitFor(async () => (writer = await writerOnceRead(fifo)) !== undefined, "the collector reading --tasks");
  return writer!;
}

const leftovers = (root: string) => readdirSync(root).filter((f) => f.includes("collector.pid"));

describe("collect: a signal before its handlers", () => {
  /** Exit 75 at once: no checkpoint, no /run, no lock file (or its temp file), no --out. */
  async function expectRequeuedUnstarted(w: GymWorld, collector: ChildProgram, out: string[]): Promise<void> {
    const exited = await Promise.race([collector.exited, new Promise((r) => setTimeout(() => r("hung"), 10_000))]);
    expect(exited, out.join("\n")).toEqual({ code: 75, signal: null });
    expect(out.some((l) => l.startsWith("SIGTERM before the start: nothing was started; exiting 75")), out.join("\n")).toBe(true);
    expect(out.some((l) => l.startsWith("stopped: checkpoint")), out.join("\n")).toBe(false);
    expect(leftovers(w.root)).toEqual([]);
    expect(existsSync(join(w.root, "results.jsonl"))).toBe(false);
    expect(await w.backend.calls()).toEqual([]);
  }

  it("SIGTERM while its modules load: exit 75 at once, nothing started", { timeout: 60_000 }, async () => {
    const w = await setUp(1);
    const paused = await pausedPackageLoad();
    try {
      const out: string[] = [];
      const collector = await startCollector(w, [], out, paused.env);
      await w.waitFor(() => paused.reached(), "the collector loading its program");
      collector.child.kill("SIGTERM");
      await paused.release();
      await expectRequeuedUnstarted(w, collector, out);
    } finally {
      await paused.remove();
    }
  });

  it("SIGTERM while it reads a --tasks FIFO whose writer stays silent: exit 75 at once, nothing left behind", { timeout: 60_000 }, async () => {
    const w = await setUp(1);
    const fifo = tasksFifo(w);
    const out: string[] = [];
    const collector = await startCollector(w, ["--tasks", fifo], out);
    const writer = await writerOnceReading(w, fifo);
    try {
      collector.child.kill("SIGTERM");
      await expectRequeuedUnstarted(w, collector, out);
    } finally {
      await writer.close();
    }
  });

  it("a --tasks FIFO that delivers is read to its end: every row finishes, exit 0", { timeout: 60_000 }, async () => {
    const w = await setUp(0);
    const fifo = tasksFifo(w);
    const finished = finishCleanly(w, 2, ["--tasks", fifo]);
    const writer = await writerOnceReading(w, fifo);
    // In two writes: the rows are all read once the writer closes, whatever arrives when.
    await writer.write('{"id":"r0","task":{"expression":"0 + 1","tool_rounds":1}}\n');
    await writer.write('{"id":"r1","task":{"expression":"1 + 1","tool_rounds":1}}\n');
    await writer.close();
    await finished;
  });

  it("SIGINT while it reads a --tasks that never ends: killed by it at once (the shell reports 130), no lock file left", { timeout: 60_000 }, async () => {
    const w = await setUp(1);
    const fifo = tasksFifo(w);
    const out: string[] = [];
    const collector = await startCollector(w, ["--tasks", fifo], out);
    const writer = await writerOnceReading(w, fifo);
    try {
      collector.child.kill("SIGINT");
      const exited = await Promise.race([collector.exited, new Promise((r) => setTimeout(() => r("hung"), 10_000))]);
      expect(exited, out.join("\n")).toEqual({ code: null, signal: "SIGINT" });
      expect(leftovers(w.root)).toEqual([]);
    } finally {
      await writer.close();
    }
  });
});
