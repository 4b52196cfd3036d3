import { randomBytes } from "node:crypto";
import { closeSync, fsync, openSync, renameSync, unlinkSync, writeSync } from "node:fs";
import { link, open, rename, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";
import { promisify } from "node:util";
import { namePath } from "../../protocol/index.js";

/** fsync a directory so a rename inside it survives a crash. */
export async function fsyncDirectory(dir: string): Promise<void> {
  const handle = await open(dir, "r");
  try {
    await handle.sync();
  } catch (error) {
    throw namePath(error, dir); // a handle's errors name no path (storage_error's detail should)
  } finally {
    await handle.close();
  }
}

/** A temp file beside `target`, written and fsynced, waiting to be renamed over it. */
export interface StagedFile {
  target: string;
  temp: string;
}

/** Prefix of every temp file this module writes (retention sweeps leftovers of crashed writers). */
export const TEMP_PREFIX = ".";
export const TEMP_SUFFIX = ".tmp";

/** A fresh temp file name beside `target` (dot-prefixed, so catalogs and listings skip it). */
export function tempPathFor(target: string): string {
  return join(dirname(target), `${TEMP_PREFIX}${basename(target)}.${process.pid}.${randomBytes(6).toString("hex")}${TEMP_SUFFIX}`);
}

/**
 * First half of a durable replace: write `data` to a temp file in the target's directory and fsync
 * it. Nothing is visible under `target` yet; `installStagedFile` makes it so, `discardStagedFile`
 * drops it. Split so the slow fsync can run before the caller knows it will install the file.
 */
export async function stageFile(target: string, data: string | Uint8Array, temp = tempPathFor(target)): Promise<StagedFile> {
  const handle = await open(temp, "wx");
  try {
    await handle.writeFile(data);
    await handle.sync();
  } catch (error) {
    await handle.close();
    await unlink(temp).catch(() => undefined);
    throw namePath(error, temp);
  }
  await handle.close();
  return { target, temp };
}

/** Second half: rename the staged temp over its target, then fsync the directory. */
export async function installStagedFile(staged: StagedFile): Promise<void> {
  try {
    await rename(staged.temp, staged.target);
  } catch (error) {
    await discardStagedFile(staged);
    throw error;
  }
  await fsyncDirectory(dirname(staged.target));
}

/**
 * Second half for a file that is never replaced: hard-link the staged temp to its target, which
 * fails when the target exists (false, nothing changed), then drop the temp. The caller fsyncs the
 * directory: the file is visible from the link on, whether or not that fsync succeeds.
 */
export async function linkStagedFile(staged: StagedFile): Promise<boolean> {
  try {
    await link(staged.temp, staged.target);
    return true;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "EEXIST") return false;
    throw error;
  } finally {
    await discardStagedFile(staged);
  }
}

export async function discardStagedFile(staged: StagedFile): Promise<void> {
  await unlink(staged.temp).catch(() => undefined);
}

/**
 * Replace `path` atomically and durably: write a temp file in the same directory, fsync it,
 * rename it over the target, fsync the directory. Readers see the old or the new file, never a mix.
 */
export async function replaceFileDurably(path: string, data: string | Uint8Array): Promise<void> {
  await installStagedFile(await stageFile(path, data));
}

/** Alias of `replaceFileDurably` (temp file, fsync, rename, directory fsync). */
export const writeFileDurably = replaceFileDurably;

// ---- mostly blocking variant --------------------------------------------------------------------
// For the few small files on a critical path (publication): every async fs call is a thread-pool
// round trip, and a durable replace takes eight of them, which measurably costs more than the
// writes on a busy 2-core machine. Here the cheap calls block and only the two fsyncs (the slow
// calls) go to the thread pool, so replies in flight (the resume) are handled meanwhile.

const fsyncInPool = promisify(fsync);

/** `stageFile` for a small file: the write blocks, only the fsync goes to the pool. */
export async function stageSmallFile(target: string, data: string | Uint8Array, temp = tempPathFor(target)): Promise<StagedFile> {
  // Opened before the try: a temp that already exists (EEXIST) is someone else's, never removed here.
  let fd: number;
  try {
    fd = openSync(temp, "wx");
  } catch (error) {
    throw namePath(error, temp);
  }
  try {
    try {
      const bytes = typeof data === "string" ? Buffer.from(data) : data;
      for (let offset = 0; offset < bytes.byteLength; ) offset += writeSync(fd, bytes, offset);
      await fsyncInPool(fd);
    } finally {
      closeSync(fd);
    }
  } catch (error) {
    removeTemp(temp);
    throw namePath(error, temp);
  }
  return { target, temp };
}

/**
 * `replaceFileDurably` for a small file: temp file, fsync (in the pool), rename, directory fsync.
 * `beforeRename` runs after the fsync's wait; throwing there leaves the target untouched.
 */
export async function replaceSmallFileDurably(path: string, data: string | Uint8Array, beforeRename?: () => void): Promise<void> {
  const { temp } = await stageSmallFile(path, data);
  try {
    beforeRename?.();
    renameSync(temp, path);
  } catch (error) {
    removeTemp(temp);
    throw namePath(error, temp);
  }
  await fsyncDirectoryInPool(dirname(path));
}

function removeTemp(temp: string): void {
  try {
    unlinkSync(temp);
  } catch {
    // the temp file was never created, or was already renamed
  }
}

/** `fsyncDirectory` whose open and close block: only the fsync goes to the pool. */
export async function fsyncDirectoryInPool(dir: string): Promise<void> {
  const fd = openSync(dir, "r");
  try {
    await fsyncInPool(fd);
  } catch (error) {
    throw namePath(error, dir);
  } finally {
    closeSync(fd);
  }
}
