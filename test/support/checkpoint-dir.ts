import { existsSync, mkdirSync } from "node:fs";
import { join } from "node:path";

/**
 * What the coordinator does before it sends a commit: the checkpoint directory `<root>/<id>` exists
 * (a participant refuses a commit into one it does not see). For the test helpers' default
 * directory; a test naming its own makes it (or not) itself. Nothing under a missing `root` (a test
 * of storage not mounted here). Synchronous, so a test's commit starts when it did before.
 */
export function createCheckpointDir(root: string, checkpointId: string): void {
  if (existsSync(root)) mkdirSync(join(root, checkpointId), { recursive: true });
}
