import { stat } from "node:fs/promises";
import { dirname } from "node:path";
import { writeFileAtomic } from "../storage/fs-durable.js";
import { invalidRequest } from "./errors.js";

/**
 * `--out` must be a regular file or a new one in an existing directory, as for `gym-ckpt collect`:
 * a mistyped directory is refused with `invalid_request` before anything is read or written,
 * never created.
 */
export async function assertWritableOut(path: string): Promise<void> {
  const parent = await stat(dirname(path)).catch(() => undefined);
  if (!parent?.isDirectory()) throw invalidRequest(`--out: directory ${dirname(path)} does not exist`);
  const out = await stat(path).catch((error: NodeJS.ErrnoException) => {
    if (error.code === "ENOENT") return undefined;
    throw invalidRequest(`--out ${path} is not accessible (${error.code ?? String(error)})`);
  });
  if (out && !out.isFile()) throw invalidRequest(`--out ${path} is not a regular file`);
}

/**
 * Writes one JSON line per value atomically, never creating the directory (checked above). The
 * lines are joined as bytes: together they may be longer than the longest string, each is not.
 */
export async function writeJsonLines(path: string, values: readonly unknown[]): Promise<void> {
  await writeFileAtomic(path, Buffer.concat(values.map((value) => Buffer.from(`${JSON.stringify(value)}\n`))), { createParents: false });
}
