import { execFileSync } from "node:child_process";
import { constants, existsSync } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { collectHarness } from "./collect-processes.js";

/**
 * A SIGUSR1 that reaches `gym-ckpt collect` while it is still starting (reading --tasks here; the
 * lock, telemetry, NATS and the restore come next). Node's default action for SIGUSR1 opens the V8
 * inspector on 127.0.0.1:9229, where any local user could run code in a process holding the
 * controller token; the request must instead be remembered and checkpoint once the collector runs.
 * A FIFO as --tasks holds the collector in start-up until the test writes the rows.
 */
const { setUp, startCollector } = collectHarness();

/** Opens the FIFO for writing once a reader has it open (ENXIO until then): the collector is reading --tasks. */
async function writerOnceRead(fifo: string): Promise<FileHandle | undefined> {
  return open(fifo, constants.O_WRONLY | constants.O_NONBLOCK).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENXIO") return undefined;
    throw error;
  });
}

describe("collect: SIGUSR1 during start-up", () => {
  it("opens no inspector and checkpoints once after start-up, however many arrived", { timeout: 60_000 }, async () => {
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
    const inspector = (l: string) => /Debugger listening|inspector/i.test(l);
    await w.waitFor(() => existsSync(join(w.root, "LATEST")) || out.some(inspector), "the remembered checkpoint (or the inspector opening)");
    expect(out.filter(inspector)).toEqual([]);
    await w.backend.release();
    expect(await collector.exited, out.join("\n")).toEqual({ code: 0, signal: null });
    expect(out).toContain("checkpoints taken: 1");
  });
});
