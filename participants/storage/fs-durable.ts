import { open, rename, writeFile } from "node:fs/promises";
import { dirname } from "node:path";

/** fsync a directory so renames and links inside it survive a crash. */
export async function fsyncDir(dir: string): Promise<void> {
  const handle = await open(dir, "r");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}

/** Write a whole file durably: temp file in the same directory, fsync, rename, fsync the directory. */
export async function writeFileAtomic(path: string, data: string | Uint8Array): Promise<void> {
  const temp = `${dirname(path)}/.${path.split("/").pop()}.${process.pid}.${Math.random().toString(16).slice(2)}.tmp`;
  await writeFile(temp, data);
  const handle = await open(temp, "r+");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
  await rename(temp, path);
  await fsyncDir(dirname(path));
}
