import { CheckpointError, isUnreadableStorage, toCheckpointError, type CtlLatestError } from "../../protocol/index.js";
import type { CatalogEntry, CheckpointCatalog } from "./checkpoint-catalog.js";

/**
 * What a listing of the published checkpoints says of LATEST, for `gym-ckpt ls` and the controller
 * API's `list` alike: a damaged LATEST never fails the listing, since that is when an operator or a
 * controller lists the checkpoints, to pick an older one to restore. `latest_error` is there only
 * with `latest` null.
 */
export interface ListedLatest {
  latest: string | null;
  latest_error?: CtlLatestError;
}

/**
 * LATEST could not be read (not a checkpoint id, not a regular file, too large; or refused to this
 * account, `storage_error`): no checkpoint is named, and why. Anything else (a bug, a root that is
 * not a directory) is rethrown: it fails the listing as it fails the scan.
 */
export function unreadLatest(error: unknown): ListedLatest {
  if (!(error instanceof CheckpointError) && !isUnreadableStorage(error)) throw error;
  const refusal = toCheckpointError(error);
  return { latest: null, latest_error: { code: refusal.code, detail: refusal.message } };
}

/**
 * LATEST names `named` (read from it): named if the listing has it; otherwise its checkpoint.json
 * is damaged or gone, which the reader must see rather than an id it cannot find in the listing,
 * so null, with why (checkpoint.json's own refusal).
 */
export async function listedLatest(catalog: CheckpointCatalog, named: string | null, published: readonly CatalogEntry[]): Promise<ListedLatest> {
  if (named === null || published.some((c) => c.checkpoint_id === named)) return { latest: named };
  try {
    await catalog.get(named);
  } catch (error) {
    return unreadLatest(error);
  }
  return { latest: null }; // published after the scan (it reads back now): named in the next listing
}
