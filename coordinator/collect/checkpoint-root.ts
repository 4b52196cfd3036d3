import { stat } from "node:fs/promises";
import { join } from "node:path";
import { CheckpointError, isUnreadableStorage } from "../../protocol/index.js";

/**
 * The collector reads and writes a checkpoint's files through its own `--checkpoint-dir`, never the
 * coordinator's path for it: the shared filesystem may be mounted elsewhere on this host. So a
 * checkpoint the coordinator wrote must show up there as `<checkpointDir>/<checkpointId>`; if not,
 * `--checkpoint-dir` is another directory, and collection.json written there would never be read
 * back (`invalid_request`). `coordinatorDir` is the coordinator's own path to the checkpoint, when known.
 * A stat the storage refused (EIO, EACCES, ESTALE) says nothing about which root this is: it is
 * thrown as it is (`storage_error`), so the operator fixes the mount, not the flag.
 */
export async function assertCheckpointVisible(checkpointDir: string, checkpointId: string, coordinatorDir?: string): Promise<void> {
  const mine = join(checkpointDir, checkpointId);
  const info = await stat(mine).catch((error: unknown) => {
    if (isUnreadableStorage(error)) throw error;
    return undefined;
  });
  if (info?.isDirectory()) return;
  const where = coordinatorDir === undefined ? "" : ` (the coordinator's checkpoint_dir: ${coordinatorDir})`;
  throw new CheckpointError(
    "invalid_request",
    `--checkpoint-dir ${checkpointDir} is not the coordinator's checkpoint root: its checkpoint ${checkpointId} is not a directory at ${mine}${where}`,
  );
}
