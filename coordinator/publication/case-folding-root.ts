import { randomBytes } from "node:crypto";
import { lstat, mkdir, rmdir } from "node:fs/promises";
import { join } from "node:path";
import { CheckpointError } from "../../protocol/index.js";
import { TRASH_PREFIX } from "./retention.js";

/** Whether a directory entry answers to `path` (not followed). */
async function entryExists(path: string): Promise<boolean> {
  return lstat(path).then(
    () => true,
    (error: NodeJS.ErrnoException) => {
      if (error.code === "ENOENT") return false;
      throw error;
    },
  );
}

/**
 * Refuses (storage_error) a checkpoint root whose filesystem folds case (macOS's and Windows'
 * defaults, a CIFS mount, ext4 casefold): checkpoint ids differing only in case (`Ck1`, `ck1`)
 * would name one `<root>/<id>` (one checkpoint written into another's directory, retention of one
 * deleting the other), as would instances `Env1`/`env1` below `gym/<kind>/`. Probed with a fresh
 * lowercase directory looked up in upper case, then removed; named like trash, so retention sweeps
 * it if this process dies first. (The participants' copy is participants/storage/case-folding-dir.ts:
 * the two sides import nothing of each other.) `exists` is a seam for tests (Linux here folds nothing).
 */
export async function refuseCaseFoldingRoot(root: string, exists: (path: string) => Promise<boolean> = entryExists): Promise<void> {
  // Another coordinator's retention on this root sweeps trash at once: a probe gone before its
  // lookup proved nothing, and is made again (a few times at most).
  for (let tries = 0; tries < 3; tries++) {
    const name = `${TRASH_PREFIX}case-probe.${process.pid}.${randomBytes(4).toString("hex")}`;
    const probe = join(root, name);
    await mkdir(probe);
    try {
      if (await exists(join(root, name.toUpperCase()))) {
        throw new CheckpointError(
          "storage_error",
          `checkpoint_root ${root} is on a case-insensitive filesystem (${name} answers as ${name.toUpperCase()}): checkpoint ids or instances differing only in case would share a directory; put the root on a case-sensitive filesystem`,
        );
      }
      if (await entryExists(probe)) return;
    } finally {
      await rmdir(probe).catch(() => undefined);
    }
  }
}
