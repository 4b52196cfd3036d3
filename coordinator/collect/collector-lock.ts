import { randomBytes } from "node:crypto";
import { join } from "node:path";
import { statSync } from "node:fs";
import { link, rm, writeFile } from "node:fs/promises";
import { CheckpointError, namePath } from "../../protocol/index.js";
import { processLine, whyProcessLineStale } from "../../protocol/process-identity.js";
import { readIfExists, takeOverStale } from "../../protocol/lock-takeover.js";

export const COLLECTOR_LOCK_FILE = "collector.pid";

const TAKEOVER_TRIES = 3;

/**
 * Lock files this process holds now, by file (device and inode), not by path: one with our pid is
 * "left by this process" only when not among them. By path, the same root spelled another way (a
 * symbolic link to it, a bind mount) would judge this process's own live lock as left by it, and take it over.
 */
const heldHere = new Set<string>();

/** The file at `path` as heldHere names it; undefined when there is none. */
function fileId(path: string): string | undefined {
  const info = statSync(path, { throwIfNoEntry: false });
  return info && `${info.dev}:${info.ino}`;
}

function heldByThisProcess(path: string): boolean {
  const id = fileId(path);
  return id !== undefined && heldHere.has(id);
}

export interface CollectorLock {
  path: string;
  /** What happened to a file left by an earlier collector, for the log (undefined: none was there). */
  tookOver: string | undefined;
  /** Removes the file, unless another collector has taken it over meanwhile. */
  release(): Promise<void>;
}

/**
 * One collector per checkpoint root: two would replace each other's `dispatched.jsonl` and retire
 * each other's attempts. The file names the collector's process (`processLine`: pid, host, start
 * time, boot id) and appears whole and only if absent (written aside, then hard-linked
 * into place, which fails when the name exists). A file whose process is alive on this host refuses
 * the start (`checkpoint_conflict`); one left by a process that no longer runs (by its start time and
 * the boot id where the file has them, so a reused pid does not keep it held), by another host (a
 * requeued job usually lands on another node after its predecessor died: liveness cannot be checked
 * there) or unreadable is taken over.
 *
 * Taking over removes the name, so it is done by one collector at a time, holding the take-over
 * directory `.collector.pid.takeover`, and judges the file again there (protocol/lock-takeover.ts).
 */
export async function acquireCollectorLock(checkpointDir: string): Promise<CollectorLock> {
  const path = join(checkpointDir, COLLECTOR_LOCK_FILE);
  const line = processLine();
  const aside = join(checkpointDir, `.${COLLECTOR_LOCK_FILE}.${token()}`);
  await writeFile(aside, line, { flag: "wx" }).catch(async (error: NodeJS.ErrnoException) => {
    // Created, then not written in full (a full disk): ours to remove. EEXIST: another's, left alone.
    if (error.code !== "EEXIST") await rm(aside, { force: true });
    throw namePath(error, aside); // a failed write on the handle names no path (ENOSPC): the refusal should
  });
  let tookOver: string | undefined;
  let heldId: string | undefined;
  const place = async () => (heldId = await linkIfAbsent(aside, path)) !== undefined;
  try {
    for (let tries = 1; ; tries++) {
      if (await place()) break;
      const held = await readIfExists(path);
      const why = held === undefined ? "released meanwhile" : whyProcessLineStale(held, () => heldByThisProcess(path));
      if (why === undefined || tries >= TAKEOVER_TRIES) throw conflict(checkpointDir, path, why === undefined ? held : undefined);
      if (held === undefined) continue;
      const taken = await takeOverStale(path, (now) => whyProcessLineStale(now, () => heldByThisProcess(path)), place);
      if (taken?.held) {
        tookOver = taken.why;
        break;
      }
    }
  } finally {
    await rm(aside, { force: true });
  }
  return {
    path,
    tookOver,
    async release() {
      // Still ours until removed: another acquisition in this process must not take it meanwhile.
      try {
        if ((await readIfExists(path)) === line) await rm(path, { force: true });
      } finally {
        if (heldId !== undefined) heldHere.delete(heldId);
      }
    },
  };
}

/**
 * Links `aside` into place; the file's id (heldHere's), undefined where the name exists. Marked held
 * at once (a blocking stat of `aside`, the same file): a take-over in this process must see it held.
 */
async function linkIfAbsent(aside: string, path: string): Promise<string | undefined> {
  try {
    await link(aside, path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") return undefined;
    throw error;
  }
  const id = fileId(aside)!; // just linked: it is there
  heldHere.add(id);
  return id;
}

function token(): string {
  return randomBytes(6).toString("hex");
}

function conflict(checkpointDir: string, path: string, live: string | undefined): CheckpointError {
  const holder = live === undefined ? "another collector" : `another collector (pid ${live.split(" ")[0]})`;
  return new CheckpointError("checkpoint_conflict", `${holder} is running on ${checkpointDir}; if none is, remove ${path}`);
}
