import { mkdir, stat } from "node:fs/promises";
import { dirname, resolve } from "node:path";

/**
 * `mkdir -p` without Node 20's recursive mkdir, which retries for ever where mkdir(2) answers
 * ENOENT under an existing parent (/proc, /sys): a process would spin, silent, for ever.
 * Here a missing parent is created once, and a second ENOENT is the answer.
 *
 * Node's contract otherwise: resolves to the first directory it created (a prefix of `path`; its
 * parent is where an fsync makes the new tree durable), or undefined when `path` already was a
 * directory; `mode` applies to every directory it creates (less the umask).
 */
export async function makeDirectories(path: string, options: { mode?: number } = {}): Promise<string | undefined> {
  try {
    await mkdir(path, options.mode);
    return path;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "EEXIST" && (await stat(path)).isDirectory()) return undefined;
    if (code !== "ENOENT" || dirname(path) === path) throw error;
    const first = await makeDirectories(dirname(path), options);
    try {
      await mkdir(path, options.mode);
    } catch (again) {
      // Made by someone else meanwhile: what this call created is still `first` (if anything).
      if ((again as NodeJS.ErrnoException).code !== "EEXIST" || !(await stat(path)).isDirectory()) throw again;
      return first;
    }
    return first ?? path;
  }
}

/**
 * The directories holding the entries `mkdir -p dir` created (`first` is what makeDirectories returned):
 * a new directory's entry lives in its parent, so those are what to fsync for it to survive a
 * crash. Empty when mkdir created nothing, so a retry costs no fsync.
 */
export function parentsOfCreated(dir: string, first: string | undefined): string[] {
  if (first === undefined) return [];
  const top = resolve(first);
  const parents: string[] = [];
  for (let d = resolve(dir); ; d = dirname(d)) {
    parents.push(dirname(d));
    if (d === top || dirname(d) === d) return parents;
  }
}

/**
 * mkdir failures saying the path cannot exist there (configuration: a restart will not help), unlike
 * EIO and the like; a symbolic-link loop on the way (ELOOP) or a component too long is the path's too.
 */
const MISPLACED = new Set(["ENOTDIR", "ENOENT", "EACCES", "EPERM", "EROFS", "EEXIST", "ELOOP", "ENAMETOOLONG"]);

export function isMisplacedDirectory(error: unknown): boolean {
  return MISPLACED.has((error as NodeJS.ErrnoException | undefined)?.code ?? "");
}
