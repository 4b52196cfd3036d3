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

/** Refuses what fstat of the opened file shows: not a regular file, or over the limit. */
function check(path: string, info: Stats, limits: { maxBytes: number }): void {
  if (!info.isFile()) throw refused(`${path} is not a regular file`);
  if (info.size > limits.maxBytes) throw tooLarge(path, info.size, limits);
}

/**
 * The chunks of one file read to its end, never more than one byte past the limit (that byte alone
 * shows the file grew after the fstat): `next()` is the buffer for the next read, `add` what it got.
 */
class LimitedChunks {
  private readonly chunks: Buffer[] = [];
  private total = 0;

  constructor(
    private readonly path: string,
    private readonly info: Stats,
    private readonly limits: { maxBytes: number },
  ) {}

  next(): Buffer {
    return Buffer.allocUnsafe(Math.max(Math.min(READ_CHUNK, this.info.size + 1, this.limits.maxBytes + 1 - this.total), 1));
  }

  add(buffer: Buffer, bytesRead: number): void {
    this.total += bytesRead;
    if (this.total > this.limits.maxBytes) throw tooLarge(this.path, this.total, this.limits);
    this.chunks.push(buffer.subarray(0, bytesRead));
  }

  bytes(): Buffer {
    return Buffer.concat(this.chunks, this.total);
  }
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
    check(path, info, limits);
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
    const chunks = new LimitedChunks(path, info, limits);
    for (;;) {
      const buffer = chunks.next();
      const { bytesRead } = await handle.read(buffer, 0, buffer.length, null);
      if (bytesRead === 0) return chunks.bytes();
      chunks.add(buffer, bytesRead);
    }
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
    check(path, info, limits);
    const chunks = new LimitedChunks(path, info, limits);
    for (;;) {
      const buffer = chunks.next();
      const bytesRead = readSync(fd, buffer, 0, buffer.length, null);
      if (bytesRead === 0) return chunks.bytes();
      chunks.add(buffer, bytesRead);
    }
  } finally {
    closeSync(fd);
  }
}
