import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { join } from "node:path";
import { link, readFile, rename, rm, writeFile } from "node:fs/promises";
import { CheckpointError } from "../../protocol/index.js";
import { parseProcessIdentity, processIdentity, whyOwnerGone } from "../../protocol/process-identity.js";

export const COLLECTOR_LOCK_FILE = "collector.pid";

/**
 * `<pid> <host> <start time> <boot id>`, the line a collector gives the lock file; `<pid> <host>`
 * where /proc has no identity, and in files older collectors left.
 */
const LOCK_LINE = /^([1-9][0-9]{0,9}) (\S{1,255})(?: (\S+) (\S+))?\n$/;

const TAKEOVER_TRIES = 3;

/** Lock files this process holds now: one with our pid is "left by this process" only when not among them. */
const heldHere = new Set<string>();

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
 * the start (`checkpoint_conflict`); one left by a process that no longer runs (by its start time and
 * the boot id where the file has them, so a reused pid does not keep it held), by another host (a requeued job
 * usually lands on another node after its predecessor died: liveness cannot be checked there) or
 * unreadable is taken over. Never by removing the name after judging its content (another
 * collector may have replaced that file meanwhile): the file is renamed aside to a name of our own
 * (atomic), and what was moved is judged again; a fresh lock moved so is linked back.
 */
export async function acquireCollectorLock(checkpointDir: string): Promise<CollectorLock> {
  const path = join(checkpointDir, COLLECTOR_LOCK_FILE);
  const line = ownLine();
  const aside = join(checkpointDir, `.${COLLECTOR_LOCK_FILE}.${randomBytes(6).toString("hex")}`);
  await writeFile(aside, line, { flag: "wx" });
  let tookOver: string | undefined;
  try {
    for (let tries = 1; ; tries++) {
      try {
        await link(aside, path);
        heldHere.add(path); // at once: a take-over in this process must see it held
        break;
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      }
      const held = await readIfExists(path);
      const why = held === undefined ? "released meanwhile" : staleBecause(held, path);
      if (why === undefined || tries >= TAKEOVER_TRIES) throw conflict(checkpointDir, path, why === undefined ? held : undefined);
      if (held === undefined) continue;
      if (await moveAsideIfStill(path, held, checkpointDir)) tookOver = why;
    }
  } finally {
    await rm(aside, { force: true });
  }
  return {
    path,
    tookOver,
    async release() {
      heldHere.delete(path);
      if ((await readIfExists(path)) === line) await rm(path, { force: true });
    },
  };
}

/**
 * Takes the lock file away only if it is still the one judged stale (`held`): renamed aside, then
 * read. Something else moved (a collector replaced the stale file after we read it) is linked back
 * and false returned, so the caller judges the lock again. Should yet another lock have taken the
 * name meanwhile, that one wins: the start is refused.
 */
async function moveAsideIfStill(path: string, held: string, checkpointDir: string): Promise<boolean> {
  const judged = join(checkpointDir, `.${COLLECTOR_LOCK_FILE}.stale.${randomBytes(6).toString("hex")}`);
  try {
    await rename(path, judged);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return false; // gone meanwhile: try to link again
    throw error;
  }
  try {
    const moved = await readIfExists(judged);
    if (moved === held) return true;
    try {
      await link(judged, path);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
      throw conflict(checkpointDir, path, undefined);
    }
    return false;
  } finally {
    await rm(judged, { force: true });
  }
}

function conflict(checkpointDir: string, path: string, live: string | undefined): CheckpointError {
  const holder = live === undefined ? "another collector" : `another collector (pid ${live.split(" ")[0]})`;
  return new CheckpointError("checkpoint_conflict", `${holder} is running on ${checkpointDir}; if none is, remove ${path}`);
}

/** This process's lock line. */
function ownLine(): string {
  const identity = processIdentity();
  return `${process.pid} ${hostname()}${identity ? ` ${identity.startTime} ${identity.bootId}` : ""}\n`;
}

/** Why a lock file's holder no longer runs; undefined while it may. */
function staleBecause(held: string, path: string): string | undefined {
  const m = LOCK_LINE.exec(held);
  if (!m) return "unreadable content";
  const pid = Number(m[1]);
  const identity = m[3] === undefined ? undefined : parseProcessIdentity(m[3], m[4]!);
  if (m[3] !== undefined && identity === undefined) return "unreadable content";
  if (m[2] !== hostname()) return `left by host ${m[2]}, whose processes cannot be checked from here`;
  // Our pid: an earlier process's (pids are reused, e.g. in a requeued container), unless we hold it now.
  if (pid === process.pid) return heldHere.has(path) ? undefined : "left by this process";
  return whyOwnerGone(pid, identity);
}

async function readIfExists(path: string): Promise<string | undefined> {
  try {
    return await readFile(path, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw error;
  }
}
