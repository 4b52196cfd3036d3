import { rm } from "node:fs/promises";
import { join } from "node:path";
import type { CheckpointCatalog } from "./checkpoint-catalog.js";

/**
 * Keeps the newest `keep` published checkpoints and deletes older ones and partial checkpoints
 * (directories without checkpoint.json), except the ids in `protect` (the checkpoint being
 * published, one still open). Returns the deleted ids.
 */
export async function applyRetention(catalog: CheckpointCatalog, keep: number, protect: ReadonlySet<string>, latest: string | null): Promise<string[]> {
  const { published, partial } = await catalog.scan();
  const doomed = [
    ...published.slice(Math.max(keep, 1)).map((e) => e.checkpoint_id),
    ...partial,
  ].filter((id) => !protect.has(id) && id !== latest);
  for (const id of doomed) await rm(join(catalog.root, id), { recursive: true, force: true });
  return doomed.sort();
}
