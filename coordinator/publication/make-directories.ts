import { mkdir, stat } from "node:fs/promises";
import { dirname } from "node:path";

/**
 * `mkdir -p` without Node 20's recursive mkdir, which retries for ever where mkdir(2) answers
 * ENOENT under an existing parent (/proc, /sys): a process would spin, silent, for ever.
 * Here a missing parent is created once, and a second ENOENT is the answer.
 */
export async function makeDirectories(path: string): Promise<void> {
  try {
    await mkdir(path);
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "EEXIST" && (await stat(path)).isDirectory()) return;
    if (code !== "ENOENT" || dirname(path) === path) throw error;
    await makeDirectories(dirname(path));
    await mkdir(path).catch(async (again: NodeJS.ErrnoException) => {
      if (again.code !== "EEXIST" || !(await stat(path)).isDirectory()) throw again;
    });
  }
}
