import { randomBytes } from "node:crypto";
import { open, rename, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";

/** fsync a directory so a rename inside it survives a crash. */
export async function fsyncDirectory(dir: string): Promise<void> {
  const handle = await open(dir, "r");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/**
 * Replace `path` atomically and durably: write a temp file in the same directory, fsync it,
 * rename it over the target, fsync the directory. Readers see the old or the new file, never a mix.
 */
export async function replaceFileDurably(path: string, data: string | Uint8Array): Promise<void> {
  const dir = dirname(path);
  const temp = join(dir, `.${basename(path)}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
  const handle = await open(temp, "wx");
  try {
    await handle.writeFile(data);
    await handle.sync();
  } catch (error) {
    await handle.close();
    await unlink(temp).catch(() => undefined);
    throw error;
  }
  await handle.close();
  try {
    await rename(temp, path);
  } catch (error) {
    await unlink(temp).catch(() => undefined);
    throw error;
  }
  await fsyncDirectory(dir);
}

/** Alias of `replaceFileDurably` (temp file, fsync, rename, directory fsync). */
export const writeFileDurably = replaceFileDurably;
