import { execFileSync, spawn } from "node:child_process";
import { constants, statSync } from "node:fs";
import { mkdtemp, open, rm, writeFile, type FileHandle } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { readTaskRows } from "../../../coordinator/collect/task-rows.js";
import { descriptorsOn } from "../../support/open-descriptors.js";
import { readTaskRowsClosed } from "../../support/task-rows-closed.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * `--tasks` read through an abort signal (the collector's SIGTERM before its start): a FIFO or pipe
 * that never delivers is given up at once, without a libuv thread left blocked in its read (which
 * would hold the process's exit too); one that delivers, and a regular file, read as before.
 */
let dir: string;
const writers: FileHandle[] = [];
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-tasks-abandon-"));
});
afterEach(async () => {
  // A writer's close ends any read still waiting, so a failing test leaves no blocked thread behind.
  for (const fifo of ["tasks.fifo"]) await writerOnceRead(join(dir, fifo)).then((w) => w?.close(), () => undefined);
  await Promise.allSettled(writers.splice(0).map((w) => w.close()));
  await rm(dir, { recursive: true, force: true });
});

/** A writer of the FIFO, once a reader has it open (undefined before). */
async function writerOnceRead(fifo: string): Promise<FileHandle | undefined> {
  const writer = await open(fifo, constants.O_WRONLY | constants.O_NONBLOCK).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENXIO") return undefined;
    throw error;
  });
  if (writer) writers.push(writer);
  return writer;
}

function fifo(): string {
  const path = join(dir, "tasks.fifo");
  execFileSync("mkfifo", [path]);
  return path;
}

const line = (id: string) => `${JSON.stringify({ id, task: { n: id } })}\n`;

describe("task rows: an abandonable read", () => {
  it("a FIFO whose writer stays silent is given up on abort, with the abort's reason", { timeout: 10_000 }, async () => {
    const path = fifo();
    const abort = new AbortController();
    const read = readTaskRows(path, { signal: abort.signal });
    read.catch(() => undefined);
    await waitUntil(async () => (await writerOnceRead(path)) !== undefined, "the read to open the FIFO");
    abort.abort(new Error("sigterm"));
    await expect(read).rejects.toThrow("sigterm");
  });

  it("a FIFO no writer ever opens is given up on abort", { timeout: 10_000 }, async () => {
    const path = fifo();
    const abort = new AbortController();
    const read = readTaskRows(path, { signal: abort.signal });
    read.catch(() => undefined);
    // Its open waits for no writer: the reader is there at once, and no writer is ever opened.
    await waitUntil(() => openCount(path) > 0, "the read to open the FIFO");
    abort.abort(new Error("sigterm"));
    await expect(read).rejects.toThrow("sigterm");
  });

  it("a pipe whose writer stays open and silent (as /dev/stdin after `sleep | …`) is given up on abort", { timeout: 10_000 }, async () => {
    // `sleep` holds the pipe's writing end; the reader after it prints its pid, so its /proc/<pid>/fd/0
    // opens that pipe (child stdio "pipe" would be a socket pair).
    const shell = spawn("sh", ["-c", 'sleep 60 | sh -c "echo \\$\\$; exec sleep 60"'], { stdio: ["ignore", "pipe", "ignore"], detached: true });
    try {
      const pid = await new Promise<string>((resolve) => shell.stdout!.once("data", (data: Buffer) => resolve(data.toString().trim())));
      const pipe = `/proc/${pid}/fd/0`;
      const abort = new AbortController();
      const read = readTaskRows(pipe, { signal: abort.signal });
      read.catch(() => undefined);
      await waitUntil(() => openCount(pipe) > 0, "the read to open the pipe");
      abort.abort(new Error("sigterm"));
      await expect(read).rejects.toThrow("sigterm");
    } finally {
      process.kill(-shell.pid!, "SIGKILL");
    }
  });

  it("a FIFO that delivers in pieces is read to its writer's close, never cut at a piece", async () => {
    const path = fifo();
    const read = readTaskRows(path, { signal: new AbortController().signal });
    let writer: FileHandle | undefined;
    await waitUntil(async () => (writer = await writerOnceRead(path)) !== undefined, "the read to open the FIFO");
    const bytes = Buffer.from(line("a") + `${JSON.stringify({ id: "b", task: { text: "ü" } })}\n` + line("c"));
    const split = bytes.indexOf(Buffer.from("ü")) + 1; // inside the character: decoded across the pieces
    await writer!.write(bytes.subarray(0, split));
    await writer!.write(bytes.subarray(split));
    await writer!.close();
    const rows = await read;
    expect(rows.map((r) => r.rolloutId)).toEqual(["a", "b", "c"]);
    expect(rows[1]!.task).toEqual({ text: "ü" });
  });

  it("a regular file reads as before, and an abort before the read reads nothing", async () => {
    const path = join(dir, "tasks.jsonl");
    await writeFile(path, line("a") + line("b"));
    expect((await readTaskRowsClosed(path, { signal: new AbortController().signal })).map((r) => r.rolloutId)).toEqual(["a", "b"]);
    await expect(readTaskRows(path, { signal: AbortSignal.abort(new Error("sigterm")) })).rejects.toThrow("sigterm");
  });
});

/** How many of this process's descriptors are open on `path`'s FIFO or pipe (by its inode), from /proc. */
function openCount(path: string): number {
  return descriptorsOn(statSync(path));
}
