import { randomBytes } from "node:crypto";
import { mkdir, open, readdir, rename, rm, rmdir, unlink, writeFile } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { processLine, whyProcessLineStale } from "./process-identity.js";

/**
 * Replacing a lock file whose owner no longer runs, shared by the collector's `collector.pid` and
 * the model participant's ledger stripe locks; not exported by index.ts.
 *
 * Breaking a stale lock removes its name, so two processes that both judged the same stale file
 * must not both remove "it": the first removes it and places its own, the second would remove that
 * fresh lock and place another beside its holder. So it is done by one process at a time, holding
 * the lock's take-over directory (`.<lock name>.takeover` beside it), which judges the file again
 * there: while the name holds a stale file nobody else changes it (a lock is placed only where the
 * name is absent, whole, and a dead owner releases nothing), so what is removed is what was judged.
 * Renaming a judged file aside and linking back a fresh one moved by mistake would leave the name
 * empty in between, for a third process to place its own beside the fresh lock's holder.
 */

const TAKEOVER_TRIES = 3;

/**
 * The most of a lock file (or take-over entry) read: its line, `<pid> <host> <start time> <boot id>`,
 * is a few hundred bytes, so a file past this is no lock we wrote (judged unreadable), and a huge one
 * must not be read whole into memory.
 */
export const MAX_LOCK_FILE_BYTES = 4096;

/** Tokens of the take-over entries this process holds now (several take-overs may run at once in one process). */
const takingHere = new Set<string>();

export interface TakeOver {
  /** Whether `place` put this process's lock there. */
  held: boolean;
  /** Why the file found there was stale; undefined when it was gone or live. */
  why: string | undefined;
}

/**
 * Holding the take-over directory of the lock at `path`: the file judged again by `whyStale`
 * (undefined while its owner may run), removed if still stale, and this process's lock placed by
 * `place` (only where the name is absent, whole; whether it did). Not held when a live owner's lock
 * is there now, or another process placed its own first; undefined (nothing done) while a live
 * process holds the take-over directory.
 */
export async function takeOverStale(
  path: string,
  whyStale: (content: string) => string | undefined | Promise<string | undefined>,
  place: () => Promise<boolean>,
): Promise<TakeOver | undefined> {
  return oneAtATime(dirname(path), `.${basename(path)}.takeover`, () => replaceStale(path, whyStale, place));
}

async function replaceStale(path: string, whyStale: (content: string) => string | undefined | Promise<string | undefined>, place: () => Promise<boolean>): Promise<TakeOver> {
  const now = await readIfExists(path);
  const why = now === undefined ? undefined : await whyStale(now);
  if (now !== undefined) {
    if (why === undefined) return { held: false, why };
    await unlink(path).catch((error: NodeJS.ErrnoException) => {
      if (error.code !== "ENOENT") throw error;
    });
  }
  return { held: await place(), why };
}

/**
 * Runs `fn` holding the directory `dir/takeoverName`; undefined (nothing run) while a live process
 * holds it. The directory appears whole, with its one entry, by renaming a private one into place,
 * which fails while the name is a non-empty directory. An entry whose process no longer runs is
 * removed by its own name, which no other holder can have: so removing it never removes a live
 * holder's, and a take-over that stays held by a dead process cannot happen at this level either.
 */
async function oneAtATime<T>(dir: string, takeoverName: string, fn: () => Promise<T>): Promise<T | undefined> {
  const shared = join(dir, takeoverName);
  await removeAbandoned(dir, `${takeoverName}.`);
  const name = token();
  const mine = join(dir, `${takeoverName}.${name}`);
  await mkdir(mine);
  takingHere.add(name);
  try {
    await writeFile(join(mine, name), processLine(), { flag: "wx" });
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
    const content = await readLockFile(entry).catch(() => "");
    if (whyProcessLineStale(content, () => takingHere.has(name)) === undefined) live = true;
    else await rm(entry, { recursive: true, force: true });
  }
  return live;
}

/**
 * Removes the private directories (`<prefix><token>`) of take-overs whose process was killed
 * before moving its directory into place, so they do not pile up beside the lock. Only a directory
 * whose entry names a process that no longer runs: one still empty, or whose line is not whole,
 * may be a live process's that has just made it.
 */
async function removeAbandoned(dir: string, prefix: string): Promise<void> {
  const names = (await readdir(dir)).filter((name) => name.startsWith(prefix));
  for (const name of names) {
    const own = name.slice(prefix.length);
    if (takingHere.has(own)) continue;
    const line = await readLockFile(join(dir, name, own)).catch(() => "");
    if (line.endsWith("\n") && whyProcessLineStale(line, () => false) !== undefined) await rm(join(dir, name), { recursive: true, force: true });
  }
}

function token(): string {
  return randomBytes(6).toString("hex");
}

/** A lock file's first MAX_LOCK_FILE_BYTES + 1 bytes: past a lock line, so a longer file never reads as one. */
async function readLockFile(path: string): Promise<string> {
  const handle = await open(path, "r");
  try {
    const buffer = Buffer.alloc(MAX_LOCK_FILE_BYTES + 1);
    let size = 0;
    while (size < buffer.length) {
      const { bytesRead } = await handle.read(buffer, size, buffer.length - size, null);
      if (bytesRead === 0) break;
      size += bytesRead;
    }
    return buffer.toString("utf8", 0, size);
  } finally {
    await handle.close();
  }
}

/** A file's content (at most MAX_LOCK_FILE_BYTES + 1 bytes of it); undefined where it does not exist. */
export async function readIfExists(path: string): Promise<string | undefined> {
  try {
    return await readLockFile(path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw error;
  }
}
