import { randomBytes } from "node:crypto";
import { promises as fs } from "node:fs";
import path from "node:path";

/**
 * Publishes `data` at `target` atomically: a dot-named temp file in the same directory
 * (so no record glob matches it and rename stays on one filesystem), write, fsync, rename,
 * then fsync the directory so the rename itself survives a crash.
 */
export async function writeFileAtomic(target: string, data: Uint8Array): Promise<void> {
  const dir = path.dirname(target);
  const created = await fs.mkdir(dir, { recursive: true });
  if (created !== undefined) {
    // New directories are durable only once their own parent entries are fsynced.
    for (let d = dir; ; d = path.dirname(d)) {
      await fsyncDir(path.dirname(d));
      if (d === created || d === path.dirname(d)) break;
    }
  }
  const temp = path.join(dir, `.${path.basename(target)}.${process.pid}.${randomBytes(6).toString("hex")}.tmp`);
  try {
    const handle = await fs.open(temp, "wx");
    try {
      await handle.writeFile(data);
      await handle.sync();
    } finally {
      await handle.close();
    }
    await fs.rename(temp, target);
  } catch (error) {
    await fs.rm(temp, { force: true });
    throw error;
  }
  await fsyncDir(dir);
}

async function fsyncDir(dir: string): Promise<void> {
  const handle = await fs.open(dir, "r");
  try {
    await handle.sync();
  } finally {
    await handle.close();
  }
}
