import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { join } from "node:path";
import { link, readFile, rm, writeFile } from "node:fs/promises";
import { CheckpointError } from "../../protocol/index.js";

export const COLLECTOR_LOCK_FILE = "collector.pid";

/** `<pid> <host>`: the only content a collector ever gives the lock file. */
const LOCK_LINE = /^([1-9][0-9]{0,9}) (\S{1,255})\n$/;

const TAKEOVER_TRIES = 3;

export interface CollectorLock {
  path: string;
  /** What happened to a file left by an earlier collector, for the log (undefined: none was there). */
  tookOver: string | undefined;
  /** Removes the file, unless another collector has taken it over meanwhile. */
  release(): Promise<void>;
}

/**
 * One collector per checkpoint root: two would replace each other's `dispatched.jsonl` and retire
 * each other's attempts. The file appears whole and only if absent (written aside, then hard-linked
 * into place, which fails when the name exists). A file whose process is alive on this host refuses
 * the start (`checkpoint_conflict`); one left by a dead process, by another host (a requeued job
 * usually lands on another node after its predecessor died: liveness cannot be checked there) or
 * unreadable is taken over.
 */
export async function acquireCollectorLock(checkpointDir: string): Promise<CollectorLock> {
  const path = join(checkpointDir, COLLECTOR_LOCK_FILE);
  const line = `${process.pid} ${hostname()}\n`;
  const aside = join(checkpointDir, `.${COLLECTOR_LOCK_FILE}.${randomBytes(6).toString("hex")}`);
  await writeFile(aside, line, { flag: "wx" });
  let tookOver: string | undefined;
  try {
    for (let tries = 1; ; tries++) {
      try {
        await link(aside, path);
        break;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      }
      const held = await readIfExists(path);
      const why = held === undefined ? "released meanwhile" : staleBecause(held);
      if (why === undefined || tries >= TAKEOVER_TRIES) {
        const holder = why === undefined ? `another collector (pid ${held!.split(" ")[0]})` : "another collector";
        throw new CheckpointError("checkpoint_conflict", `${holder} is running on ${checkpointDir}; if none is, remove ${path}`);
      }
      // Only the file we judged: one that changed meanwhile is judged again.
      if (held === undefined) continue;
      if ((await readIfExists(path)) === held) await rm(path, { force: true });
      tookOver = why;
    }
  } finally {
    await rm(aside, { force: true });
  }
  return {
    path,
    tookOver,
    async release() {
      if ((await readIfExists(path)) === line) await rm(path, { force: true });
    },
  };
}

/** Why a lock file's holder no longer runs; undefined while it may. */
function staleBecause(held: string): string | undefined {
  const m = LOCK_LINE.exec(held);
  if (!m) return "unreadable content";
  const pid = Number(m[1]);
  if (m[2] !== hostname()) return `left by host ${m[2]}, whose processes cannot be checked from here`;
  if (pid === process.pid) return "left by this process";
  try {
    process.kill(pid, 0);
    return undefined;
  } catch (error) {
    // EPERM: alive, owned by another user.
    return (error as NodeJS.ErrnoException).code === "ESRCH" ? `pid ${pid} is not running` : undefined;
  }
}

async function readIfExists(path: string): Promise<string | undefined> {
  try {
    return await readFile(path, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw error;
  }
}
