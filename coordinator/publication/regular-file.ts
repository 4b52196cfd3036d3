import { createHash } from "node:crypto";
import { closeSync, constants, fstatSync, openSync, readSync, type Stats } from "node:fs";
import { open, type FileHandle } from "node:fs/promises";
import { CheckpointError, namePath } from "../../protocol/index.js";

/*
 * Reading a file someone else put into the checkpoint root (a participant, the controller, an
 * operator) without trusting what it is: opened with O_NONBLOCK, so a FIFO answers at once instead
 * of blocking until a writer appears (while the engine lock or the event loop waits on it), then
 * refused unless fstat shows a regular file within the caller's size limit. Errors of the open
 * itself (ENOENT, EACCES) are passed on for the caller to name.
 */

export interface RegularFileLimits {
  /** Larger is `invalid_checkpoint_state`; the bytes read are counted too, in case it grows. */
  maxBytes: number;
  /** Refuse a symbolic link (its last component) instead of following it, e.g. out of the checkpoint directory. */
  noFollow?: boolean;
}

const READ_CHUNK = 1 << 20;

function flags(limits: RegularFileLimits): number {
  return constants.O_RDONLY | constants.O_NONBLOCK | (limits.noFollow ? constants.O_NOFOLLOW : 0);
}

function refused(path: string, detail: string): CheckpointError {
  return new CheckpointError("invalid_checkpoint_state", `${path} ${detail}`);
}

function tooLarge(path: string, size: number, limits: RegularFileLimits): CheckpointError {
  return refused(path, `is ${size} bytes, over the ${limits.maxBytes}-byte limit`);
}

/** ELOOP is how O_NOFOLLOW reports a symbolic link. */
function openFailure(path: string, error: unknown, limits: RegularFileLimits): unknown {
  if (limits.noFollow && (error as NodeJS.ErrnoException).code === "ELOOP") return refused(path, "is a symbolic link");
  return error;
}

function check(path: string, info: Stats, limits: RegularFileLimits): void {
  if (!info.isFile()) throw refused(path, "is not a regular file");
  if (info.size > limits.maxBytes) throw tooLarge(path, info.size, limits);
}

/** One read buffer sized to the file (one byte more shows whether it grew), at most READ_CHUNK. */
function readBuffer(info: Stats): Buffer {
  return Buffer.allocUnsafe(Math.min(info.size + 1, READ_CHUNK));
}

/** Opens `path` for reading once it is known to be a regular file within the limits. */
export async function openRegularFile(path: string, limits: RegularFileLimits): Promise<{ handle: FileHandle; info: Stats }> {
  let handle: FileHandle;
  try {
    handle = await open(path, flags(limits));
  } catch (error) {
    throw openFailure(path, error, limits);
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

/** The whole file as UTF-8, refused if it is not a regular file or exceeds `maxBytes`. */
export async function readRegularFile(path: string, limits: RegularFileLimits): Promise<string> {
  return (await readRegularFileBytes(path, limits)).toString("utf8");
}

/**
 * The whole file's bytes, as `readRegularFile`: for a file whose digest is pinned, which must be
 * hashed as stored (decoding first maps invalid UTF-8 to U+FFFD, so other bytes could hash alike).
 */
export async function readRegularFileBytes(path: string, limits: RegularFileLimits): Promise<Buffer> {
  const { handle, info } = await openRegularFile(path, limits);
  try {
    const chunks: Buffer[] = [];
    let total = 0;
    for (;;) {
      const fresh = readBuffer(info);
      const { bytesRead, buffer } = await handle.read(fresh, 0, fresh.length, null);
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
 * `readRegularFile`, blocking, for the few callers that are (the catalog's scan, the coordinator's
 * config file and the CLI's `@file` flags, read with the other flags); also returns its bytes (for a
 * strict decode) and the fstat of what it read.
 */
export function readRegularFileSync(path: string, limits: RegularFileLimits): { text: string; bytes: Buffer; info: Stats } {
  let fd: number;
  try {
    fd = openSync(path, flags(limits));
  } catch (error) {
    throw openFailure(path, error, limits);
  }
  try {
    const info = fstatSync(fd);
    check(path, info, limits);
    const chunks: Buffer[] = [];
    let total = 0;
    for (;;) {
      const buffer = readBuffer(info);
      const bytesRead = readSync(fd, buffer, 0, buffer.length, null);
      if (bytesRead === 0) break;
      total += bytesRead;
      if (total > limits.maxBytes) throw tooLarge(path, total, limits);
      chunks.push(buffer.subarray(0, bytesRead));
    }
    const bytes = Buffer.concat(chunks, total);
    return { text: bytes.toString("utf8"), bytes, info };
  } finally {
    closeSync(fd);
  }
}

/**
 * sha256 (hex) of a regular file within the limits, streamed; with `sync`, the file is fsynced
 * too (through the same descriptor), for a file about to be referenced by what is published.
 */
export async function sha256RegularFile(path: string, limits: RegularFileLimits, options: { sync?: boolean } = {}): Promise<string> {
  const { handle } = await openRegularFile(path, limits);
  try {
    const hash = createHash("sha256");
    let total = 0;
    for await (const chunk of handle.createReadStream({ autoClose: false }) as AsyncIterable<Buffer>) {
      total += chunk.byteLength;
      if (total > limits.maxBytes) throw tooLarge(path, total, limits);
      hash.update(chunk);
    }
    if (options.sync) await handle.sync();
    return hash.digest("hex");
  } catch (error) {
    throw namePath(error, path); // a handle's errors (EIO on read or fsync) name no path
  } finally {
    await handle.close();
  }
}
