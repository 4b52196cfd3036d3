import { realpath, stat } from "node:fs/promises";
import { basename, dirname, isAbsolute, join, relative, sep } from "node:path";
import { writeFileAtomic } from "../storage/fs-durable.js";
import { invalidRequest } from "./errors.js";

/**
 * `--out` must be a regular file or a new one in an existing directory, as for `gym-ckpt collect`:
 * a mistyped directory is refused with `invalid_request` before anything is read or written,
 * never created. Nor may it replace what the export reads: the `--tasks` file, or anything inside
 * the checkpoint (its checkpoint.json, say, which would unpublish it).
 */
export async function assertWritableOut(path: string, reads: { tasks?: string; checkpoint?: string } = {}): Promise<void> {
  const parent = await stat(dirname(path)).catch(() => undefined);
  if (!parent?.isDirectory()) throw invalidRequest(`--out: directory ${dirname(path)} does not exist`);
  const out = await stat(path).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENOENT") return undefined;
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

/**
 * Writes one JSON line per value atomically, never creating the directory (checked above). The
 * lines are joined as bytes: together they may be longer than the longest string, each is not.
 */
export async function writeJsonLines(path: string, values: readonly unknown[]): Promise<void> {
  await writeFileAtomic(path, Buffer.concat(values.map((value) => Buffer.from(`${JSON.stringify(value)}\n`))), { createParents: false });
}
