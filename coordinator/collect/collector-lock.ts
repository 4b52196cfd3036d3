import { randomBytes } from "node:crypto";
import { hostname } from "node:os";
import { join } from "node:path";
import { link, mkdir, readFile, readdir, rename, rm, rmdir, unlink, writeFile } from "node:fs/promises";
import { CheckpointError } from "../../protocol/index.js";
import { parseProcessIdentity, processIdentity, whyOwnerGone } from "../../protocol/process-identity.js";

export const COLLECTOR_LOCK_FILE = "collector.pid";

/** Where a take-over happens one at a time: a directory holding one file, named by its holder's token. */
const TAKEOVER_DIR = `.${COLLECTOR_LOCK_FILE}.takeover`;

/**
 * `<pid> <host> <start time> <boot id>`, the line a collector gives the lock file (and its
 * take-over entry); `<pid> <host>` where /proc has no identity, and in files older collectors left.
 */
const LOCK_LINE = /^([1-9][0-9]{0,9}) (\S{1,255})(?: (\S+) (\S+))?\n$/;

const TAKEOVER_TRIES = 3;

/** Lock files this process holds now: one with our pid is "left by this process" only when not among them. */
const heldHere = new Set<string>();
/** Tokens of the take-over entries this process holds now (several acquisitions may run at once in one process). */
const takingHere = new Set<string>();

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
 * the boot id where the file has them, so a reused pid does not keep it held), by another host (a
 * requeued job usually lands on another node after its predecessor died: liveness cannot be checked
 * there) or unreadable is taken over.
 *
 * Taking over removes the name, so it is done by one collector at a time, holding the take-over
 * directory, and judges the file again there: while the name holds a stale file nobody else changes
 * it (a starter links only where it is absent, a dead owner releases nothing), so what is removed
 * is what was judged. Renaming a judged file aside and linking back a fresh one moved by mistake
 * would leave the name empty in between, for a third collector to link its own beside the fresh
 * lock's holder.
 */
export async function acquireCollectorLock(checkpointDir: string): Promise<CollectorLock> {
  const path = join(checkpointDir, COLLECTOR_LOCK_FILE);
  const line = ownLine();
  const aside = join(checkpointDir, `.${COLLECTOR_LOCK_FILE}.${token()}`);
  await writeFile(aside, line, { flag: "wx" });
  let tookOver: string | undefined;
  try {
    for (let tries = 1; ; tries++) {
      if (await linkIfAbsent(aside, path)) break;
      const held = await readIfExists(path);
      const why = held === undefined ? "released meanwhile" : staleBecause(held, () => heldHere.has(path));
      if (why === undefined || tries >= TAKEOVER_TRIES) throw conflict(checkpointDir, path, why === undefined ? held : undefined);
      if (held === undefined) continue;
      const taken = await oneAtATime(checkpointDir, () => replaceStale(path, aside));
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
        heldHere.delete(path);
      }
    },
  };
}

/**
 * Links `aside` into place; false where the name exists. Marked held at once: a take-over in this
 * process must see it held.
 */
async function linkIfAbsent(aside: string, path: string): Promise<boolean> {
  try {
    await link(aside, path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") return false;
    throw error;
  }
  heldHere.add(path);
  return true;
}

/**
 * Holding the take-over directory: the lock file judged again, removed if still stale, ours linked.
 * Not held when a live collector's lock is there now, or a starter linked its own first.
 */
async function replaceStale(path: string, aside: string): Promise<{ held: boolean; why: string | undefined }> {
  const now = await readIfExists(path);
  const why = now === undefined ? undefined : staleBecause(now, () => heldHere.has(path));
  if (now !== undefined) {
    if (why === undefined) return { held: false, why };
    await unlink(path).catch((error: NodeJS.ErrnoException) => {
      if (error.code !== "ENOENT") throw error;
    });
  }
  return { held: await linkIfAbsent(aside, path), why };
}

/**
 * Runs `fn` holding the take-over directory; undefined (nothing run) while a live collector holds
 * it. The directory appears whole, with its one entry, by renaming a private one into place, which
 * fails while the name is a non-empty directory. An entry whose process no longer runs is removed
 * by its own name, which no other holder can have: so removing it never removes a live holder's,
 * and a lock that stays held by a dead process cannot happen at this level either.
 */
async function oneAtATime<T>(checkpointDir: string, fn: () => Promise<T>): Promise<T | undefined> {
  const shared = join(checkpointDir, TAKEOVER_DIR);
  const name = token();
  const mine = join(checkpointDir, `${TAKEOVER_DIR}.${name}`);
  await mkdir(mine);
  takingHere.add(name);
  try {
    await writeFile(join(mine, name), ownLine(), { flag: "wx" });
    for (let tries = 1; ; tries++) {
      try {
        await rename(mine, shared);
        break;
      } catch (error) {
        if (!["ENOTEMPTY", "EEXIST"].includes((error as NodeJS.ErrnoException).code ?? "")) throw error;
      }
      if (tries >= TAKEOVER_TRIES || (await liveHolder(shared))) return undefined;
    }
    try {
      return await fn();
    } finally {
      await rm(join(shared, name), { force: true });
      // Empty now, unless the next holder moved in: that one stays.
      await rmdir(shared).catch((error: NodeJS.ErrnoException) => {
        if (!["ENOTEMPTY", "EEXIST", "ENOENT"].includes(error.code ?? "")) throw error;
      });
    }
  } finally {
    takingHere.delete(name);
    await rm(mine, { recursive: true, force: true });
  }
}

/** Whether a live process holds the take-over directory; entries of processes that no longer run are removed. */
async function liveHolder(shared: string): Promise<boolean> {
  const names = await readdir(shared).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENOENT" || error.code === "ENOTDIR") return [];
    throw error;
  });
  let live = false;
  for (const name of names) {
    const entry = join(shared, name);
    const content = await readFile(entry, "utf8").catch(() => "");
    if (staleBecause(content, () => takingHere.has(name)) === undefined) live = true;
    else await rm(entry, { recursive: true, force: true });
  }
  return live;
}

/** This process's lock line. */
function ownLine(): string {
  const identity = processIdentity();
  return `${process.pid} ${hostname()}${identity ? ` ${identity.startTime} ${identity.bootId}` : ""}\n`;
}

function token(): string {
  return randomBytes(6).toString("hex");
}

function conflict(checkpointDir: string, path: string, live: string | undefined): CheckpointError {
  const holder = live === undefined ? "another collector" : `another collector (pid ${live.split(" ")[0]})`;
  return new CheckpointError("checkpoint_conflict", `${holder} is running on ${checkpointDir}; if none is, remove ${path}`);
}

/** Why a lock line's process no longer runs; undefined while it may. `heldHere`: whether this process holds what a line with our pid names. */
function staleBecause(line: string, heldHere: () => boolean): string | undefined {
  const m = LOCK_LINE.exec(line);
  if (!m) return "unreadable content";
  const pid = Number(m[1]);
  const identity = m[3] === undefined ? undefined : parseProcessIdentity(m[3], m[4]!);
  if (m[3] !== undefined && identity === undefined) return "unreadable content";
  if (m[2] !== hostname()) return `left by host ${m[2]}, whose processes cannot be checked from here`;
  // Our pid: an earlier process's (pids are reused, e.g. in a requeued container), unless we hold it now.
  if (pid === process.pid) return heldHere() ? undefined : "left by this process";
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
