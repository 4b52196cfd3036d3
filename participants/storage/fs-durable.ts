import { randomBytes } from "node:crypto";
import { link, open, rename, rm, type FileHandle } from "node:fs/promises";
import { basename, dirname, join, resolve } from "node:path";
import { makeDirectories, namePath, parentsOfCreated } from "../../protocol/index.js";

/** fsync a directory so renames and links inside it survive a crash. */
export async function fsyncDir(dir: string): Promise<void> {
  const handle = await open(dir, "r");
  try {
    await handle.sync();
  } catch (error) {
    throw namePath(error, dir); // a handle's errors name no path
  } finally {
    await handle.close();
  }
}

/**
 * Directories holding an entry writeFileAtomic made (a directory, a link or rename) whose fsync
 * failed: the retry finds the entry there and makes nothing, so it fsyncs these instead
 * (process-wide: it is the disk's).
 */
const unsynced = new Set<string>();

/** The longest file name (in bytes) most file systems take: NAME_MAX. */
const NAME_MAX = 255;

/**
 * `.<name>.<pid>.<12 hex>.tmp`, with `name` cut (on a character boundary) only as far as the whole
 * must fit NAME_MAX: a target name the file system takes (a 250-byte `seeds --out`) failed
 * ENAMETOOLONG on its temp name. A name that fits keeps its full form (the capture ledger reads its key from it).
 */
function tempName(name: string): string {
  const suffix = `.${process.pid}.${randomBytes(6).toString("hex")}.tmp`;
  return `.${fittedName(name, suffix)}${suffix}`;
}

/** `name`, cut on a character boundary as far as `.<name><suffix>` must to fit NAME_MAX. */
function fittedName(name: string, suffix: string): string {
  const room = NAME_MAX - 1 - Buffer.byteLength(suffix);
  if (Buffer.byteLength(name) <= room) return name;
  let kept = "";
  for (const char of name) {
    if (Buffer.byteLength(kept + char) > room) break;
    kept += char;
  }
  return kept;
}

/** A temp name tempName makes: the (maybe cut) target name, then the pid, 12 hex and `.tmp`. */
const TEMP_NAME = /^\.(.+)(\.[0-9]+\.[0-9a-f]{12}\.tmp)$/s;

/**
 * The file name a temp file of writeFileAtomic's was made for, as its name carries it (cut when the
 * whole was too long); null when `candidate` is no such temp name. Lets a writer find the temp files
 * a crash left between their create and their rename or link.
 */
export function tempNameTarget(candidate: string): string | null {
  return TEMP_NAME.exec(candidate)?.[1] ?? null;
}

/** Whether `candidate` is a temp name writeFileAtomic makes for a file named `name` (any process's). */
export function isTempNameOf(name: string, candidate: string): boolean {
  const m = TEMP_NAME.exec(candidate);
  return m !== null && m[1] === fittedName(name, m[2]!);
}

/** Writes all of `chunk` at the handle's position (a write may take fewer bytes than asked). */
async function writeAll(handle: FileHandle, chunk: Uint8Array): Promise<void> {
  for (let done = 0; done < chunk.byteLength; ) done += (await handle.write(chunk, done, chunk.byteLength - done)).bytesWritten;
}

/**
 * Publishes `data` at `target` atomically (an iterable's chunks are written one after another,
 * each in full before the next is asked for, so a chunk may reuse the previous one's memory): a dot-named temp file in the same directory (no glob matches it, and the rename
 * stays on one filesystem), write, fsync, rename, then fsync the
 * directory so the rename itself survives a crash. Readers see the old file or the new one.
 * Missing parent directories are created, unless `createParents` is false (a path a user typed:
 * a mistyped directory must fail, ENOENT, rather than appear). With `exclusive`, the temp file is
 * hard-linked into place instead, which never replaces an existing target: false when one was there
 * (nothing changed), so of two concurrent writers exactly one creates the file. `onPublished` is
 * called once the new file is in place, before the directory fsync (which may still fail): a caller
 * whose state follows the target's content learns it changed even when the write then rejects.
 */
export async function writeFileAtomic(
  target: string,
  data: string | Uint8Array | Iterable<Uint8Array>,
  options: { mode?: number; createParents?: boolean; exclusive?: boolean; onPublished?: () => void } = {},
): Promise<boolean> {
  const dir = dirname(target);
  if (options.createParents !== false) {
    for (const parent of parentsOfCreated(dir, await makeDirectories(dir))) unsynced.add(parent);
  }
  const at = resolve(dir);
  for (const parent of [...unsynced]) {
    if (at !== parent && !at.startsWith(parent.endsWith("/") ? parent : `${parent}/`)) continue; // not on this write's path
    await fsyncDir(parent);
    unsynced.delete(parent);
  }
  const temp = join(dir, tempName(basename(target)));
  try {
    // Exclusive: never written through a file or symlink planted under the temp name.
    const handle = await open(temp, "wx", options.mode);
    try {
      if (typeof data === "string" || data instanceof Uint8Array) await handle.writeFile(data);
      else for (const chunk of data) await writeAll(handle, chunk);
      await handle.sync();
    } finally {
      await handle.close();
    }
    if (options.exclusive) {
      const created = await link(temp, target).then(
        () => true,
        (error: NodeJS.ErrnoException) => {
          if (error.code === "EEXIST") return false;
          throw error;
        },
      );
      await rm(temp, { force: true });
      if (!created) return false;
    } else {
      await rename(temp, target);
    }
  } catch (error) {
    await rm(temp, { force: true });
    throw namePath(error, temp);
  }
  options.onPublished?.();
  try {
    await fsyncDir(dir);
  } catch (error) {
    unsynced.add(at); // the link or rename is there: a retry finds it and must make it durable
    throw error;
  }
  return true;
}
