import { realpath, stat } from "node:fs/promises";
import { basename, dirname, isAbsolute, join, relative, sep } from "node:path";
import { isUnreadableStorage } from "../../protocol/index.js";
import { isTempNameOf, writeFileAtomic } from "../storage/fs-durable.js";
import { removeStaleTempFiles } from "../storage/stale-temp-files.js";
import { invalidRequest } from "./errors.js";

/**
 * `--out` must be a regular file or a new one in an existing directory, as for `gym-ckpt collect`:
 * a mistyped directory is refused with `invalid_request` before anything is read or written,
 * never created. Nor may it replace what the export reads: the `--tasks` file, or anything inside
 * the checkpoint (its checkpoint.json, say, which would unpublish it).
 */
export async function assertWritableOut(path: string, reads: { tasks?: string; checkpoint?: string } = {}): Promise<void> {
  // The storage refusing (EIO, EACCES, a stale mount) is storage_error, exit 1, as for collect's
  // --out: the disk or mount needs fixing, not the path, which a bad request (exit 2) would say.
  const parent = await stat(dirname(path)).catch((error: unknown) => {
    if (isUnreadableStorage(error)) throw error;
    return undefined;
  });
  if (!parent?.isDirectory()) throw invalidRequest(`--out: directory ${dirname(path)} does not exist`);
  const out = await stat(path).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENOENT") return undefined;
    if (isUnreadableStorage(error)) throw error;
    throw invalidRequest(`--out ${path} is not accessible (${error.code ?? String(error)})`);
  });
  if (out && !out.isFile()) throw invalidRequest(`--out ${path} is not a regular file`);
  const tasks = reads.tasks === undefined ? undefined : await stat(reads.tasks).catch(() => undefined);
  if (out && tasks && out.dev === tasks.dev && out.ino === tasks.ino) throw invalidRequest(`--out ${path} is the --tasks file`);
  if (reads.checkpoint !== undefined) {
    // Compared through real paths: a link or `..` in either names the same directory.
    const checkpoint = await realpath(reads.checkpoint).catch(() => undefined);
    const fromCheckpoint = checkpoint === undefined ? undefined : relative(checkpoint, join(await realpath(dirname(path)), basename(path)));
    if (fromCheckpoint !== undefined && fromCheckpoint !== ".." && !fromCheckpoint.startsWith(`..${sep}`) && !isAbsolute(fromCheckpoint)) {
      throw invalidRequest(`--out ${path} is inside the checkpoint ${reads.checkpoint}, which the export reads`);
    }
  }
}

/** UTF-16 code units per piece a JSON line is encoded in: at most 3 UTF-8 bytes each. */
export const LINE_PIECE_UNITS = 1 << 20;

/**
 * `text` as UTF-8, in pieces of at most LINE_PIECE_UNITS code units encoded into `buffer`, which
 * each piece reuses: a piece must be written before the next is asked for. A piece never ends
 * between the two halves of a surrogate pair (each half alone would be encoded as U+FFFD).
 */
function* utf8Pieces(text: string, buffer: Buffer): Generator<Uint8Array> {
  for (let start = 0; start < text.length; ) {
    let end = Math.min(text.length, start + LINE_PIECE_UNITS);
    const last = text.charCodeAt(end - 1);
    if (end < text.length && last >= 0xd800 && last <= 0xdbff) end -= 1;
    yield buffer.subarray(0, buffer.write(text.slice(start, end)));
    start = end;
  }
}

const NEWLINE = Buffer.from("\n");

/**
 * Writes one JSON line per value atomically, never creating the directory (checked above). The
 * lines are written one after another as bytes: together they may be longer than the longest
 * string, each is not. Each line is encoded piece by piece into one small buffer, so no copy of a
 * line's bytes, nor of the whole file, is ever held (a large seed's was a slow allocation).
 */
export async function writeJsonLines(path: string, values: readonly unknown[]): Promise<void> {
  const buffer = Buffer.allocUnsafe(3 * LINE_PIECE_UNITS);
  function* lines(): Generator<Uint8Array> {
    for (const value of values) {
      yield* utf8Pieces(String(JSON.stringify(value)), buffer);
      yield NEWLINE;
    }
  }
  // Temp files of this name a crashed export left (an export of a large checkpoint is one large file).
  await removeStaleTempFiles(dirname(path), (name) => isTempNameOf(basename(path), name));
  await writeFileAtomic(path, lines(), { createParents: false });
}
