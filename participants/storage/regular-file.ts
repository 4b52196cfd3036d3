import { closeSync, constants, fstatSync, openSync, readSync, type Stats } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { CheckpointError } from "../../protocol/index.js";

/*
 * Reading a file that someone else may have put there (an index or step marker beside records, a
 * checkpoint's manifests) without trusting what it is: opened with O_NONBLOCK, so a FIFO answers at
 * once instead of blocking until a writer appears (a replay reload is single-flight: every later
 * next() would wait on it), then refused unless fstat of that handle shows a regular file within
 * the caller's limit, and never read past limit + 1 bytes (a file that grows after the fstat).
 * The coordinator has the same guard (coordinator/publication/regular-file.ts); the two sides never
 * import each other and protocol/ does no I/O, so this is the participants' copy. Errors of the open
 * itself (ENOENT, EACCES) are passed on for the caller to name.
 */

export interface RegularFileLimits {
  /** Larger is `invalid_checkpoint_state`. */
  maxBytes: number;
  /** Refuse a symbolic link (its last component) instead of following it. */
  noFollow?: boolean;
}

/** A refusal of what the file is (not a regular file, too large, a link); a CheckpointError tells it from an open error. */
function refused(detail: string): CheckpointError {
  return new CheckpointError("invalid_checkpoint_state", detail);
}

const READ_CHUNK = 1 << 20;

function tooLarge(path: string, size: number, limits: { maxBytes: number }): CheckpointError {
  return refused(`${path} is ${size} bytes, over the ${limits.maxBytes}-byte limit`);
}

/** Opens `path` for reading once fstat of the handle shows a regular file within the limit. */
export async function openRegularFile(path: string, limits: RegularFileLimits): Promise<{ handle: FileHandle; info: Stats }> {
  let handle: FileHandle;
  try {
    handle = await open(path, constants.O_RDONLY | constants.O_NONBLOCK | (limits.noFollow ? constants.O_NOFOLLOW : 0));
  } catch (error) {
    // ELOOP is how O_NOFOLLOW reports a symbolic link.
    if (limits.noFollow && (error as NodeJS.ErrnoException).code === "ELOOP") throw refused(`${path} is a symbolic link`);
    throw error;
  }
  try {
    const info = await handle.stat();
    if (!info.isFile()) throw refused(`${path} is not a regular file`);
    if (info.size > limits.maxBytes) throw tooLarge(path, info.size, limits);
    return { handle, info };
  } catch (error) {
    await handle.close();
    throw error;
  }
}

/** The whole file's bytes, refused if it is not a regular file or holds more than `maxBytes`. */
export async function readRegularFile(path: string, limits: RegularFileLimits): Promise<Buffer> {
  const { handle, info } = await openRegularFile(path, limits);
  try {
    const chunks: Buffer[] = [];
    let total = 0;
    for (;;) {
      // Never ask for more than one byte past the limit: that byte alone shows the file grew.
      const want = Math.min(READ_CHUNK, info.size + 1, limits.maxBytes + 1 - total);
      const buffer = Buffer.allocUnsafe(Math.max(want, 1));
      const { bytesRead } = await handle.read(buffer, 0, buffer.length, null);
      if (bytesRead === 0) break;
      total += bytesRead;
      if (total > limits.maxBytes) throw tooLarge(path, total, limits);
      chunks.push(buffer.subarray(0, bytesRead));
    }
    return Buffer.concat(chunks, total);
  } finally {
    await handle.close();
  }
}

/**
 * `readRegularFile`, blocking, for a file read before anything else runs (a program's config file
 * checked with its flags); symbolic links are followed, as a mounted config is often one.
 */
export function readRegularFileSync(path: string, limits: { maxBytes: number }): Buffer {
  const fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK);
  try {
    const info = fstatSync(fd);
    if (!info.isFile()) throw refused(`${path} is not a regular file`);
    if (info.size > limits.maxBytes) throw tooLarge(path, info.size, limits);
    const chunks: Buffer[] = [];
    let total = 0;
    for (;;) {
      const buffer = Buffer.allocUnsafe(Math.max(Math.min(READ_CHUNK, info.size + 1, limits.maxBytes + 1 - total), 1));
      const bytesRead = readSync(fd, buffer, 0, buffer.length, null);
      if (bytesRead === 0) break;
      total += bytesRead;
      if (total > limits.maxBytes) throw tooLarge(path, total, limits);
      chunks.push(buffer.subarray(0, bytesRead));
    }
    return Buffer.concat(chunks, total);
  } finally {
    closeSync(fd);
  }
}
