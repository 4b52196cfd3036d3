import { stat } from "node:fs/promises";
import { dirname } from "node:path";
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
