import { CheckpointError, isUnreadableStorage, toCheckpointError, type CtlLatestError, type CtlReplyOf } from "../../protocol/index.js";
import type { CatalogEntry, CheckpointCatalog } from "./checkpoint-catalog.js";

/**
 * The listing of a checkpoint root, for `gym-ckpt ls` and the controller API's `list` alike: the
 * published checkpoints, what LATEST names, and the damaged ones. Neither a damaged LATEST nor a
 * damaged checkpoint fails it, since that is when an operator or a controller lists the
 * checkpoints, to pick an older one to restore. `latest_error` is there only with `latest` null,
 * `damaged` only when one is.
 */
export type CatalogListing = CtlReplyOf<"list">;

/** How many times the listing reads LATEST and the catalog for a view that lists what LATEST names. */
const LIST_READS = 3;

/** What a listing says of LATEST: `latest_error` only with `latest` null. */
interface ListedLatest {
  latest: string | null;
  latest_error?: CtlLatestError;
}

/**
 * LATEST, then the directories (one blocking scan, so no publication runs between the two reads
 * but the one LATEST's read awaited): LATEST is renamed only once its checkpoint.json is in place,
 * so the scan lists it. Scanned first, a publication finished while LATEST was read would name a
 * checkpoint the list lacks, and list one its retention deleted. Read again, a few times, while
 * retention deleted what LATEST named before the scan (retention 1, two publications meanwhile).
 * A LATEST that cannot be read, or still names a checkpoint the list lacks (damaged or gone), is
 * no failure: `latest` null, `latest_error` why. A root that is gone or not mounted is (`assertRootHeld`).
 */
export async function catalogListing(catalog: CheckpointCatalog): Promise<CatalogListing> {
  // A root gone or not mounted is refused whole (storage_error): not an empty listing, nor one whose LATEST alone is in error.
  catalog.assertRootHeld();
  for (let read = 1; ; read++) {
    let latest: string | null;
    try {
      latest = await catalog.latest();
    } catch (error) {
      return withDamaged(unreadLatest(error), catalog.scan());
    }
    const scanned = catalog.scan();
    if (read === LIST_READS || latest === null || scanned.published.some((e) => e.checkpoint_id === latest)) {
      return withDamaged(await listedLatest(catalog, latest, scanned.published), scanned);
    }
  }
}

/**
 * The id LATEST names, or null when it names none: nothing published, or a LATEST that cannot be
 * read, which `list` reports (`latest_error`). For `get`, whose checkpoint is answered all the same:
 * a damaged LATEST is when a controller reads an older checkpoint's scope to restore it.
 */
export async function latestOrNone(catalog: CheckpointCatalog): Promise<string | null> {
  try {
    return await catalog.latest();
  } catch (error) {
    return unreadLatest(error).latest;
  }
}

function withDamaged(listed: ListedLatest, { published, damaged }: ReturnType<CheckpointCatalog["scan"]>): CatalogListing {
  return { ...listed, checkpoints: published, ...(damaged.length > 0 && { damaged }) };
}

/**
 * LATEST could not be read (not a checkpoint id, not a regular file, too large; or refused to this
 * account, `storage_error`): no checkpoint is named, and why. Anything else (a bug, a root that is
 * not a directory) is rethrown: it fails the listing as it fails the scan.
 */
function unreadLatest(error: unknown): ListedLatest {
  if (!(error instanceof CheckpointError) && !isUnreadableStorage(error)) throw error;
  const refusal = toCheckpointError(error);
  return { latest: null, latest_error: { code: refusal.code, detail: refusal.message } };
}

/**
 * LATEST names `named` (read from it): named if the listing has it; otherwise its checkpoint.json
 * is damaged or gone, which the reader must see rather than an id it cannot find in the listing,
 * so null, with why (checkpoint.json's own refusal).
 */
async function listedLatest(catalog: CheckpointCatalog, named: string | null, published: readonly CatalogEntry[]): Promise<ListedLatest> {
  if (named === null || published.some((c) => c.checkpoint_id === named)) return { latest: named };
  try {
    await catalog.get(named);
  } catch (error) {
    return unreadLatest(error);
  }
  return { latest: null }; // published after the scan (it reads back now): named in the next listing
}
