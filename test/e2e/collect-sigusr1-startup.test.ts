import { execFileSync } from "node:child_process";
import { constants, existsSync, readFileSync, statSync } from "node:fs";
import { mkdtemp, open, rm, type FileHandle } from "node:fs/promises";
import { tmpdir } from "node:os";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";
import { startChildProgram } from "../../coordinator/local/child-program.js";
import { pausedPackageLoad } from "../support/paused-package-load.js";
import { waitUntil } from "../support/wait-until.js";
import { collectHarness } from "./collect-processes.js";

/**
 * A SIGUSR1 that reaches `gym-ckpt collect` while it is still starting. Node's default action for
 * SIGUSR1 opens the V8 inspector on 127.0.0.1:9229, where any local user could run code in a
 * process holding the controller token; the request must instead be remembered and checkpoint once
 * the collector runs. Two moments: while it loads its modules (held at its first `require`, the
 * bundled program's first npm package, by a preloaded hook), and while it reads --tasks (a FIFO
 * holds it there until the test writes the rows). Before the entry module runs at all no listener
 * can exist: a SIGUSR1 in Node's own first tens of milliseconds kills the process or opens the
 * inspector, whatever the program; so the entry must be a small file (checked last below).
 */
const { setUp, startCollector } = collectHarness();
const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));
const inspector = (l: string) => /Debugger listening|inspector/i.test(l);

/** Opens the FIFO for writing once a reader has it open (ENXIO until then): the collector is reading --tasks. */
async function writerOnceRead(fifo: string): Promise<FileHandle | undefined> {
  return open(fifo, constants.O_WRONLY | constants.O_NONBLOCK).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENXIO") return undefined;
    throw error;
  });
}

describe("collect: SIGUSR1 during start-up", () => {
  it("while its modules load: opens no inspector and checkpoints once the collector has started", { timeout: 90_000 }, async () => {
    const w = await setUp(1);
    const paused = await pausedPackageLoad();
    try {
      await w.backend.hold(0);
      const out: string[] = [];
      const collector = await startCollector(w, [], out, paused.env);
      await w.waitFor(() => paused.reached(), "the collector loading its program");
      collector.child.kill("SIGUSR1");
      collector.child.kill("SIGUSR1");
      await paused.release();
      await w.waitFor(() => existsSync(join(w.root, "LATEST")) || out.some(inspector) || collector.child.exitCode !== null, "the remembered checkpoint (or the inspector opening)");
      expect(out.filter(inspector)).toEqual([]);
      await w.backend.release();
      expect(await collector.exited, out.join("\n")).toEqual({ code: 0, signal: null });
      expect(out).toContain("checkpoints taken: 1");
    } finally {
      await paused.remove();
    }
  });

  it("while it reads --tasks: opens no inspector and checkpoints once after start-up, however many arrived", { timeout: 60_000 }, async () => {
    const w = await setUp(1);
    const fifo = join(w.root, "tasks.fifo");
    execFileSync("mkfifo", [fifo]);
    await w.backend.hold(0);
    const out: string[] = [];
    const collector = await startCollector(w, ["--tasks", fifo], out);
    let writer: FileHandle | undefined;
    await w.waitFor(async () => (writer = await writerOnceRead(fifo)) !== undefined, "the collector reading --tasks");
    collector.child.kill("SIGUSR1");
    collector.child.kill("SIGUSR1");
    await writer!.write('{"id":"r0","task":{"expression":"0 + 1","tool_rounds":1}}\n');
    await writer!.close();
    await w.waitFor(() => existsSync(join(w.root, "LATEST")) || out.some(inspector), "the remembered checkpoint (or the inspector opening)");
    expect(out.filter(inspector)).toEqual([]);
    await w.backend.release();
    expect(await collector.exited, out.join("\n")).toEqual({ code: 0, signal: null });
    expect(out).toContain("checkpoints taken: 1");
  });
});

describe("other commands: SIGUSR1 while they load", () => {
  it("is ignored: no inspector, the command runs as without it", { timeout: 60_000 }, async () => {
    const root = await mkdtemp(join(tmpdir(), "gym-ckpt-ls-usr1-"));
    const paused = await pausedPackageLoad();
    const out: string[] = [];
    const stdout: string[] = [];
    const onLine = (line: string, stream: "stdout" | "stderr") => void (stream === "stdout" ? stdout : out).push(line);
    const ls = await startChildProgram(CLI, ["ls", "--root", root, "--json"], { env: paused.env, onLine });
    try {
      await waitUntil(() => paused.reached() || ls.child.exitCode !== null, "gym-ckpt ls loading its program");
      expect(paused.reached(), [...stdout, ...out].join("\n")).toBe(true); // held there, not exited before it
      ls.child.kill("SIGUSR1");
      await paused.release();
      expect(await ls.exited, [...stdout, ...out].join("\n")).toEqual({ code: 0, signal: null });
      expect(out.filter(inspector)).toEqual([]);
      expect(JSON.parse(stdout.join("\n"))).toEqual({ latest: null, checkpoints: [] });
    } finally {
      await ls.kill("SIGKILL");
      await paused.remove();
      await rm(root, { recursive: true, force: true });
    }
  });
});

describe("the CLI's entry", () => {
  it("is the small file tsc wrote, the program bundled apart: Node parses a whole file before its first line runs, and the entry's first lines install the listeners", () => {
    // A bundled entry (7 MB) put its listeners ~0.35 s after the process started, not ~0.1 s.
    expect(statSync(CLI).size).toBeLessThan(16 * 1024);
    expect(readFileSync(CLI, "utf8")).toContain('import("./program.js")');
    // The program is bundled: it imports its chunks beside it, not commander from node_modules.
    const program = readFileSync(join(dirname(CLI), "program.js"), "utf8");
    expect(program).toMatch(/from "\.\/program-chunk-\w+\.js"/);
    expect(program).not.toMatch(/from "commander"/);
  });
});
