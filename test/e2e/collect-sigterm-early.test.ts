import { execFileSync } from "node:child_process";
import { constants, readdirSync } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { pausedPackageLoad } from "../support/paused-package-load.js";
import { collectHarness } from "./collect-processes.js";

/**
 * A SIGTERM (or SIGINT) that reaches `gym-ckpt collect` before its own handlers exist: while its
 * modules load, or while it reads --tasks. Node's default action would kill it at once (a signal
 * death, not the documented 75 a scheduler requeues on). A SIGTERM must behave as during the rest
 * of start-up: the start goes on, then the stop checkpoint, exit 75. A SIGINT still ends it at once (it must not wait for a stalled --tasks).
 */
const { setUp, startCollector } = collectHarness();

async function writerOnceRead(fifo: string): Promise<FileHandle | undefined> {
  return open(fifo, constants.O_WRONLY | constants.O_NONBLOCK).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENXIO") return undefined;
    throw error;
  });
}

const leftovers = (root: string) => readdirSync(root).filter((f) => f.includes("collector.pid"));

describe("collect: a signal before its handlers", () => {
  it("SIGTERM while its modules load: the stop checkpoint once started, exit 75", { timeout: 60_000 }, async () => {
    const w = await setUp(1);
    const paused = await pausedPackageLoad();
    try {
      await w.backend.hold(0);
      const out: string[] = [];
      const collector = await startCollector(w, [], out, paused.env);
      await w.waitFor(() => paused.reached(), "the collector loading its first package");
      collector.child.kill("SIGTERM");
      await paused.release();
      const exited = await Promise.race([collector.exited, new Promise((r) => setTimeout(() => r("hung"), 40_000))]);
      expect(exited, out.join("\n")).toEqual({ code: 75, signal: null });
      expect(out.some((l) => l.startsWith("stopped: checkpoint") && l.includes("published")), out.join("\n")).toBe(true);
      expect(leftovers(w.root)).toEqual([]);
    } finally {
      await w.backend.release();
      await paused.remove();
    }
  });

  it("SIGTERM while it reads --tasks: the stop checkpoint once started, exit 75", { timeout: 60_000 }, async () => {
    const w = await setUp(1);
    const fifo = join(w.root, "tasks.fifo");
    execFileSync("mkfifo", [fifo]);
    await w.backend.hold(0);
    const out: string[] = [];
    const collector = await startCollector(w, ["--tasks", fifo], out);
    let writer: FileHandle | undefined;
    await w.waitFor(async () => (writer = await writerOnceRead(fifo)) !== undefined, "the collector reading --tasks");
    collector.child.kill("SIGTERM");
    await new Promise((r) => setTimeout(r, 200));
    await writer!.write('{"id":"r0","task":{"expression":"0 + 1","tool_rounds":1}}\n').catch(() => undefined);
    await writer!.close();
    const exited = await Promise.race([collector.exited, new Promise((r) => setTimeout(() => r("hung"), 40_000))]);
    await w.backend.release();
    expect(exited, out.join("\n")).toEqual({ code: 75, signal: null });
    expect(out.some((l) => l.startsWith("stopped: checkpoint") && l.includes("published")), out.join("\n")).toBe(true);
    expect(leftovers(w.root)).toEqual([]);
  });

  it("SIGINT while it reads a --tasks that never ends: killed by it at once (the shell reports 130), no lock file left", { timeout: 60_000 }, async () => {
    const w = await setUp(1);
    const fifo = join(w.root, "tasks.fifo");
    execFileSync("mkfifo", [fifo]);
    const out: string[] = [];
    const collector = await startCollector(w, ["--tasks", fifo], out);
    let writer: FileHandle | undefined;
    await w.waitFor(async () => (writer = await writerOnceRead(fifo)) !== undefined, "the collector reading --tasks");
    try {
      collector.child.kill("SIGINT");
      const exited = await Promise.race([collector.exited, new Promise((r) => setTimeout(() => r("hung"), 10_000))]);
      expect(exited, out.join("\n")).toEqual({ code: null, signal: "SIGINT" });
      expect(leftovers(w.root)).toEqual([]);
    } finally {
      await writer!.close();
    }
  });
});
