import { randomBytes } from "node:crypto";
import { linkSync, lstatSync, renameSync, rmdirSync } from "node:fs";
import { lstat, readdir, rm } from "node:fs/promises";
import { join } from "node:path";
import { LATEST_FILE, PARTICIPANTS_DIR, ROOT_DEPLOYMENT_FILE } from "../../protocol/index.js";
import type { CheckpointCatalog } from "./checkpoint-catalog.js";
import { TEMP_PREFIX, TEMP_SUFFIX } from "./durable-fs.js";

/** Prefix of a deleted checkpoint's directory while its files are being removed. */
export const TRASH_PREFIX = ".trash-";

/**
 * Keeps the newest `keep` published checkpoints and deletes older ones and partial checkpoints
 * (without checkpoint.json, empty or holding the participants' directory; see
 * CheckpointCatalog.scan), except the ids in `protect` (the checkpoint being published, one still
 * open). Other directories at the root are a controller's and are left alone, and so is an empty one
 * written into since the scan (`takeAwayPartial`). Returns the deleted ids.
 *
 * A deleted checkpoint leaves the catalog at once: its directory is renamed to a dot-name (one
 * metadata operation); `removeTrash` frees its files later, off the checkpoint's critical path.
 * Blocking on purpose: a readdir, a stat per checkpoint and a rename take microseconds each, less
 * than the thread-pool round trips of their async forms.
 *
 * A checkpoint that cannot be renamed away (EBUSY, EPERM) is handed to `onError` and the others are
 * still deleted: one stuck directory must not keep retention from freeing the disk for ever. It is
 * tried again at the next publication. Without `onError` the first such error is thrown once every
 * other checkpoint was tried.
 */
export function applyRetention(
  catalog: CheckpointCatalog,
  keep: number,
  protect: ReadonlySet<string>,
  onError?: (checkpointId: string, error: unknown) => void,
): string[] {
  const { published, partial } = catalog.scan();
  const older = published.slice(Math.max(keep, 1)).map((e) => e.checkpoint_id);
  const doomed = [...older.map((id) => ({ id, partial: false })), ...partial.map((id) => ({ id, partial: true }))].filter(({ id }) => !protect.has(id));
  const deleted: string[] = [];
  let failure: { error: unknown } | undefined;
  for (const { id, partial } of doomed) {
    try {
      if (partial && !takeAwayPartial(catalog.root, id)) continue;
      if (!partial) trashCheckpointDir(catalog.root, id);
      deleted.push(id);
    } catch (error) {
      if (onError) onError(id, error);
      else failure ??= { error };
    }
  }
  if (failure) throw failure.error;
  return deleted.sort();
}

/**
 * A partial checkpoint taken away (true) or left (false). An empty one is removed by rmdir, which
 * fails once anything was written into it since the scan: an id-named directory at the root may be
 * another writer's that was empty then (`collect --records-dir <root>` makes rollouts/ at its start
 * and its first step later), and renamed away it would have taken that write with it. Such a
 * directory is left; one holding the participants' directory that commits write is trashed.
 */
function takeAwayPartial(root: string, id: string): boolean {
  const dir = join(root, id);
  try {
    rmdirSync(dir);
    return true;
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    if (code === "ENOENT") return false;
    if (code !== "ENOTEMPTY" && code !== "EEXIST") throw error;
  }
  if (!lstatSync(join(dir, PARTICIPANTS_DIR), { throwIfNoEntry: false })?.isDirectory()) return false;
  trashCheckpointDir(root, id);
  return true;
}

/**
 * Takes `<root>/<id>` (or `<root>/<id>/<below>`) away at once, renamed to a dot-name at the root;
 * `removeTrash` frees it later.
 */
export function trashCheckpointDir(root: string, id: string, below?: string): void {
  const from = below === undefined ? join(root, id) : join(root, id, below);
  renameSync(from, join(root, `${TRASH_PREFIX}${id}${below === undefined ? "" : `.${below}`}.${randomBytes(4).toString("hex")}`));
}

/**
 * Gives `<root>/<name>` a second link among the trash (returned), so that replacing it by a rename
 * does not free its inode inside rename(2): on ext4 that takes 0.15–0.2 ms on an idle machine and
 * up to 1.4 ms on a busy one, with the event loop blocked. Removing the link later, in the thread
 * pool, frees it; `removeTrash` sweeps one a crash left. Best effort: without it (no such file yet,
 * a refusal) the rename frees the inode itself, blocking as above.
 */
export function linkToTrash(root: string, name: string): string | undefined {
  const link = join(root, `${TRASH_PREFIX}${name}.${randomBytes(4).toString("hex")}`);
  try {
    linkSync(join(root, name), link);
    return link;
  } catch {
    return undefined; // nothing to keep, or the storage refused: the rename that follows reports a real failure
  }
}

/**
 * How old a LATEST temp file not in this writer's `inUse` must be before `removeTrash` takes it for
 * a crashed writer's. A younger one may be another writer's staging right now (another writer's in
 * the same process: one pid for both). Age alone does not tell a successor's staging: it is written
 * at the prepare and renamed at publication, which a long prepare puts minutes apart; hence
 * `removeTrash`'s `mayRemoveTemps`.
 */
export const LEFTOVER_TEMP_AGE_MS = 60_000;

/**
 * Removes trashed checkpoint directories and the temp files of LATEST (or of the deployment claim) that crashed writers left at
 * the root (older than `LEFTOVER_TEMP_AGE_MS`), except those in `inUse` (a publication staged them
 * and will rename them). Nothing else at the root is touched: it may belong to a controller
 * (dispatch log, results).
 *
 * `mayRemoveTemps` (the leadership check) is asked right before each temp file is removed: a
 * clean-up queued while leading may run after the lease was lost (behind a slow removal of old
 * checkpoints), when a temp file past that age can be the successor's staging for a long prepare,
 * whose publication would then fail. Trash is anyone's to remove. The successor stages only after
 * a whole lease period of its own, so a check passed here is not overtaken by the unlink.
 */
export async function removeTrash(root: string, inUse: ReadonlySet<string>, mayRemoveTemps: () => boolean = () => true): Promise<void> {
  let names: string[];
  try {
    names = await readdir(root);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return;
    throw error;
  }
  for (const name of names) {
    const path = join(root, name);
    const leftover =
      name.startsWith(TRASH_PREFIX) || (isRootTemp(name) && !inUse.has(path) && (await olderThan(path, LEFTOVER_TEMP_AGE_MS)) && mayRemoveTemps());
    if (leftover) await rm(path, { recursive: true, force: true });
  }
}

/** A temp file of one of the root's own files: LATEST, or the deployment claim (root-deployment.ts). */
function isRootTemp(name: string): boolean {
  return [LATEST_FILE, ROOT_DEPLOYMENT_FILE].some((file) => name.startsWith(`${TEMP_PREFIX}${file}.`)) && name.endsWith(TEMP_SUFFIX);
}

/** Whether `path` was last modified more than `ms` ago (false when it is gone). */
async function olderThan(path: string, ms: number): Promise<boolean> {
  const info = await lstat(path).catch(() => undefined);
  return info !== undefined && Date.now() - info.mtimeMs >= ms;
}
