import { randomBytes } from "node:crypto";
import { constants } from "node:fs";
import { lstat, open, readdir, unlink } from "node:fs/promises";
import { join } from "node:path";
import { CheckpointError } from "../../protocol/index.js";
import { removeStaleProbeFiles } from "./stale-probe-files.js";

/** The filesystem calls the probe makes: a seam for tests (Linux here is case-sensitive). */
export interface CaseProbeFs {
  /** Creates `path` exclusively (never through a symlink). */
  create(path: string): Promise<void>;
  /** Whether a directory entry answers to `path` (not followed). */
  exists(path: string): Promise<boolean>;
  remove(path: string): Promise<void>;
}

export const nodeCaseProbeFs: CaseProbeFs = {
  async create(path) {
    await (await open(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | (constants.O_NOFOLLOW ?? 0), 0o600)).close();
  },
  async exists(path) {
    return lstat(path).then(
      () => true,
      (error: NodeJS.ErrnoException) => {
        if (error.code === "ENOENT") return false;
        throw error;
      },
    );
  },
  remove: (path) => unlink(path),
};

/**
 * Refuses `dir` (`storage_error`) when its filesystem folds case (macOS's and Windows' defaults, a
 * CIFS mount, ext4 with casefold): a directory holding one file per id (the capture ledger's
 * `<capture_key>.lineage.jsonl`) would give ids differing only in case (`R1`, `r1`) one file, while
 * their locks differ, so their rows would interleave. Probed with a fresh lowercase name, looked up
 * in upper case, removed.
 */
export async function refuseCaseFoldingDir(dir: string, what: string, fs: CaseProbeFs = nodeCaseProbeFs): Promise<void> {
  const name = `.case-probe.${process.pid}.${randomBytes(6).toString("hex")}`;
  const lower = join(dir, name);
  await fs.create(lower);
  try {
    if (await fs.exists(join(dir, name.toUpperCase()))) {
      throw new CheckpointError(
        "storage_error",
        `${what} ${dir} is on a case-insensitive filesystem (${name} answers as ${name.toUpperCase()}): ids that differ only in case would share a file; put it on a case-sensitive filesystem`,
      );
    }
  } finally {
    await fs.remove(lower).catch(() => undefined);
  }
}

/**
 * A participant's start with a configured checkpoint root: records go to
 * `<root>/<checkpoint_id>/gym/<kind>/<instance>`, so checkpoint ids or instances differing only in
 * case would share a directory where the root folds case. A root not there yet is not probed (the
 * coordinator makes it, and refuses a folding one, as coordinator/publication/case-folding-root.ts).
 * Probe files a crash left there are removed first (stale-probe-files.ts). A root this process may
 * not write a probe into is not probed (its writes go below `<root>/<id>/`).
 */
export async function refuseCaseFoldingCheckpointRoot(root: string, fs: CaseProbeFs = nodeCaseProbeFs): Promise<void> {
  let names: string[];
  try {
    names = await readdir(root);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return;
    throw error;
  }
  await removeStaleProbeFiles(root, names);
  try {
    await refuseCaseFoldingDir(root, "checkpoint root", fs);
  } catch (error) {
    // Found folding: refused. A probe the root does not let this process write (a root it may only
    // read, /proc, a read-only mount of the share) is no refusal: a participant writes only below
    // `<root>/<id>/`, which the coordinator makes, and the coordinator probes the root itself.
    if (error instanceof CheckpointError) throw error;
  }
}
