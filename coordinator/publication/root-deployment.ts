import { join } from "node:path";
import { CheckpointError, MAX_ROOT_DEPLOYMENT_BYTES, ROOT_DEPLOYMENT_FILE, RootDeploymentSchema, describeZodError } from "../../protocol/index.js";
import { fsyncDirectory, linkStagedFile, stageFile } from "./durable-fs.js";
import { readRegularFile } from "./regular-file.js";

/**
 * Claims the checkpoint root for `deployment`, or refuses it (`invalid_request`, configuration) when
 * another deployment claimed it first. Two deployments' coordinators on one root undo each other:
 * each one's retention takes the other's checkpoints for its own (deleting the older published ones,
 * and one still being written as partial), and each publication moves LATEST to its own checkpoint,
 * so the other job's "restore the latest" restores this job's state into it (the participants'
 * instance names are often the same). Nothing in a checkpoint names its deployment, so the root
 * does: the first coordinator to start writes ROOT_DEPLOYMENT_FILE (create-only: of two starting at
 * once, one writes it and the other reads it), every later start compares, before anything else
 * touches the root. A root from before this file is claimed by the first coordinator restarted on it.
 */
export async function claimRootForDeployment(root: string, deployment: string): Promise<void> {
  const path = join(root, ROOT_DEPLOYMENT_FILE);
  let owner = await readRootDeployment(path);
  if (owner === undefined) {
    const created = await linkStagedFile(await stageFile(path, `${JSON.stringify({ deployment })}\n`));
    if (created) {
      await fsyncDirectory(root);
      return;
    }
    owner = await readRootDeployment(path); // another coordinator claimed it in between
  }
  if (owner !== deployment) {
    throw new CheckpointError(
      "invalid_request",
      `checkpoint_root ${root} holds the checkpoints of deployment ${JSON.stringify(owner)} (${ROOT_DEPLOYMENT_FILE}), not of this coordinator's deployment ${JSON.stringify(deployment)}: each deployment needs a root of its own (their retention and LATEST would undo each other's). Give this coordinator another checkpoint_root, or, if the deployment was renamed and the old name runs nowhere, remove ${path}`,
    );
  }
}

/**
 * Refuses (storage_error) a root that holds no deployment claim yet, or is missing: with
 * `require_existing_root_claim`, a start must not make and claim a root that may be an empty mount
 * point whose storage is not mounted yet. storage_error, not configuration: a restart once the
 * storage is mounted succeeds (exit 1, which supervisors restart). The claim, when there, is
 * compared by `claimRootForDeployment`, as without the option.
 */
export async function assertRootClaimed(root: string): Promise<void> {
  const path = join(root, ROOT_DEPLOYMENT_FILE);
  if ((await readRootDeployment(path)) !== undefined) return;
  throw new CheckpointError(
    "storage_error",
    `ENOENT: checkpoint_root ${root} holds no ${ROOT_DEPLOYMENT_FILE} (${path}) and require_existing_root_claim is set: its storage may not be mounted (an empty mount point), so the root is neither made nor claimed. Mount it and start again; a root never claimed yet is claimed by a start without require_existing_root_claim`,
  );
}

/** The deployment `path` names; undefined when there is no such file (or no root). */
async function readRootDeployment(path: string): Promise<string | undefined> {
  let text: string;
  try {
    text = await readRegularFile(path, { maxBytes: MAX_ROOT_DEPLOYMENT_BYTES, noFollow: true });
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    if (error instanceof CheckpointError) throw unusable(path, error.message);
    throw error;
  }
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch (error) {
    throw unusable(path, `is not JSON (${(error as Error).message})`);
  }
  const parsed = RootDeploymentSchema.safeParse(value);
  if (!parsed.success) throw unusable(path, `is not {"deployment": "<name>"} (${describeZodError(parsed.error)})`);
  return parsed.data.deployment;
}

function unusable(path: string, detail: string): CheckpointError {
  const shown = detail.startsWith(path) ? detail : `${path} ${detail}`;
  return new CheckpointError("invalid_request", `${shown}: it names the deployment whose checkpoints this root holds. Write {"deployment": "<name>"} into it, or remove it while no coordinator runs on the root`);
}
