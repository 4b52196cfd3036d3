import { readdir } from "node:fs/promises";
import { join } from "node:path";
import { CheckpointError, PARTICIPANTS_DIR, canonicalJson, isUnreadableStorage, toCheckpointError, type GlobalManifest } from "../../protocol/index.js";
import type { CheckpointCatalog } from "./checkpoint-catalog.js";
import { bad, insideCheckpointDir, readCommittedRecords } from "./committed-records.js";
import { controllerStateDigest } from "./global-manifest-writer.js";

export interface VerifiedParticipant {
  kind: string;
  instance: string;
  records: number;
  bytes: number;
}

export interface VerifyReport {
  checkpoint_id: string;
  participants: VerifiedParticipant[];
  records: number;
  bytes: number;
}

/**
 * Re-reads a published checkpoint end to end: the global manifest (each (kind, instance) once),
 * every participant manifest (its digest as recorded globally, identity, schema), every records
 * file (sha256 over every line with its newline, line count, each line a JSON record with an
 * episode_id), each entry's `episode_ids` against the capture keys its records name (the commit
 * reply's list, which the participant derives from the same records: sorted, unique) and the
 * controller state file. Throws a CheckpointError naming the first mismatch.
 */
export async function verifyCheckpoint(catalog: CheckpointCatalog, checkpointId: string): Promise<VerifyReport> {
  const manifest: GlobalManifest = await catalog.get(checkpointId);
  const dir = catalog.dirFor(checkpointId);
  const participants: VerifiedParticipant[] = [];
  const seen = new Set<string>();
  for (const entry of manifest.participants) {
    const label = `${entry.kind}/${entry.instance}`;
    // Two entries would share one directory: the second overwrote or shadows what the first committed.
    if (seen.has(label)) throw bad(`${label}: listed twice in checkpoint.json`);
    seen.add(label);
    const committed = await readCommittedRecords(dir, checkpointId, entry);
    if (canonicalJson(committed.episodeIds) !== canonicalJson(entry.episode_ids)) {
      throw bad(`${label}: its records name ${committed.episodeIds.length} episodes; checkpoint.json's episode_ids differ (${entry.episode_ids.length} listed)`);
    }
    participants.push({ kind: entry.kind, instance: entry.instance, records: committed.count, bytes: committed.bytes });
  }
  await refuseUnlisted(dir, seen);
  const state = manifest.controller_state;
  if (state && "file" in state) {
    let digest: string;
    try {
      insideCheckpointDir(dir, state.file, "controller state");
      digest = await controllerStateDigest(dir, state.file);
    } catch (error) {
      if (error instanceof CheckpointError) throw error;
      // There but unreadable (EACCES, EIO) is the storage's refusal, not a checkpoint missing a file.
      if (isUnreadableStorage(error)) throw toCheckpointError(error);
      throw bad(`controller state file ${state.file} is missing`, error);
    }
    if (digest !== state.sha256) throw bad(`controller state file ${state.file} digest does not match checkpoint.json`);
  }
  return {
    checkpoint_id: checkpointId,
    participants,
    records: participants.reduce((n, p) => n + p.records, 0),
    bytes: participants.reduce((n, p) => n + p.bytes, 0),
  };
}

/**
 * Every participant that commits is listed in checkpoint.json (one failed commit publishes
 * nothing), so a `gym/<kind>/<instance>` directory it does not list is an entry lost from it: a
 * restore would leave that participant's state out. Dot-names (a crashed writer's temp files) and
 * anything outside `gym/` (the controller's) are not checked.
 */
async function refuseUnlisted(dir: string, listed: ReadonlySet<string>): Promise<void> {
  const entries = async (path: string) => {
    try {
      return (await readdir(path, { withFileTypes: true })).filter((e) => !e.name.startsWith("."));
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT" && listed.size === 0) return [];
      if (isUnreadableStorage(error)) throw error;
      throw bad(`${path.slice(dir.length + 1)} cannot be listed`, error);
    }
  };
  for (const kind of await entries(join(dir, PARTICIPANTS_DIR))) {
    const at = `${PARTICIPANTS_DIR}/${kind.name}`;
    if (!kind.isDirectory()) throw bad(`${at} is not a participant kind's directory`);
    for (const instance of await entries(join(dir, PARTICIPANTS_DIR, kind.name))) {
      if (!listed.has(`${kind.name}/${instance.name}`)) throw bad(`${at}/${instance.name} holds a participant's files that checkpoint.json does not list`);
    }
  }
}
