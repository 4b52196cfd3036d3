import { lstatSync, mkdirSync } from "node:fs";
import { join } from "node:path";

/**
 * Creates (mode 0700) and checks the directory `base/parts…` for data another local user must not
 * reach: `base` is a shared directory such as the system temp dir, so every level below it must be a
 * real directory (no symlink) owned by this user and writable by no one else — otherwise another user
 * could have planted it and swap or read its files. Throws a message naming the offending level.
 */
export function ensurePrivateDir(base: string, parts: string[], uid: number | undefined = process.getuid?.()): string {
  let dir = base;
  for (const part of parts) {
    dir = join(dir, part);
    try {
      mkdirSync(dir, { mode: 0o700 });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
    }
    const info = lstatSync(dir);
    if (info.isSymbolicLink() || !info.isDirectory()) throw new Error(`${dir} is not a directory (a symlink or file is in its place): refusing to keep the capture ledger there`);
    // Platforms without uids (Windows) have no such owner check to make.
    if (uid !== undefined && info.uid !== uid) throw new Error(`${dir} belongs to uid ${info.uid}, not to this user (${uid}): refusing to keep the capture ledger there`);
    if ((info.mode & 0o022) !== 0) throw new Error(`${dir} is writable by group or others (mode ${(info.mode & 0o777).toString(8)}): refusing to keep the capture ledger there`);
  }
  return dir;
}
