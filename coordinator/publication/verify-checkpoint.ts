import { readdir } from "node:fs/promises";
import type { Dirent } from "node:fs";
import { join } from "node:path";
import { CheckpointError, GLOBAL_MANIFEST_FILE, MANIFEST_FILE, PARTICIPANTS_DIR, RECORDS_FILE_PATTERN, canonicalJson, isUnreadableStorage, toCheckpointError, type GlobalManifest } from "../../protocol/index.js";
import type { CheckpointCatalog } from "./checkpoint-catalog.js";
import { bad, insideCheckpointDir, readCommittedRecords } from "./committed-records.js";
import { TEMP_PREFIX, TEMP_SUFFIX } from "./durable-fs.js";
import { controllerStateDigest } from "./global-manifest-writer.js";

export interface VerifiedParticipant {
  kind: string;
  instance: string;
  records: number;
  bytes: number;
}

/**
 * A file or directory in the checkpoint that no manifest names, by what it looks like: `temp`, a
 * crashed writer's temp file (a participant's records or manifest, gym-ckpt's checkpoint.json);
 * `records`, a records file its participant's manifest does not name (a commit that lost a race
 * to another writer, or crashed before its manifest); `other`, nothing gym-ckpt writes.
 */
export interface UnreferencedFile {
  /** Relative to the checkpoint directory. */
  path: string;
  kind: "temp" | "records" | "other";
}

export interface VerifyReport {
  checkpoint_id: string;
  participants: VerifiedParticipant[];
  records: number;
  bytes: number;
  /** Sorted by path; empty when every file of the participants' tree is named. */
  unreferenced: UnreferencedFile[];
}

/**
 * Re-reads a published checkpoint end to end: the global manifest (each (kind, instance) once),
 * every participant manifest (its digest as recorded globally, identity, schema), every records
 * file (sha256 over every line with its newline, line count, each line a JSON record with an
 * episode_id), each entry's `episode_ids` against the capture keys its records name (the commit
 * reply's list, which the participant derives from the same records: sorted, unique) and the
 * controller state file. Throws a CheckpointError naming the first mismatch. Files no manifest
 * names are reported (`unreferenced`), not refused: see `unreferencedFiles`.
 */
export async function verifyCheckpoint(catalog: CheckpointCatalog, checkpointId: string): Promise<VerifyReport> {
  const manifest: GlobalManifest = await catalog.get(checkpointId);
  const dir = catalog.dirFor(checkpointId);
  const participants: VerifiedParticipant[] = [];
  const seen = new Set<string>();
  /** Each participant's records file, by `kind/instance`. */
  const recordsFiles = new Map<string, string>();
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
    recordsFiles.set(label, committed.manifest.records_file);
  }
  const unreferenced = await unreferencedFiles(dir, recordsFiles);
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
    unreferenced,
  };
}

/** A participant's temp records or manifest (participants/storage/fs-storage.ts): `.<file>.<pid>.<hex>`. */
const PARTICIPANT_TEMP = /^\.(?:records\.jsonl|manifest\.json)\.\d+\.[0-9a-f]+$/;

/** gym-ckpt's temp of checkpoint.json (durable-fs.ts, tempPathFor): `.checkpoint.json.<pid>.<hex>.tmp`. */
function isGlobalManifestTemp(name: string): boolean {
  return name.startsWith(`${TEMP_PREFIX}${GLOBAL_MANIFEST_FILE}.`) && name.endsWith(TEMP_SUFFIX);
}

/**
 * What of the participants' tree (`gym/`) no manifest names, and gym-ckpt's own leftover temps of
 * checkpoint.json beside it. Every participant that commits is listed in checkpoint.json (one
 * failed commit publishes nothing), so a `gym/<kind>/<instance>` directory it does not list is an
 * entry lost from it: a restore would leave that participant's state out, and it is refused. Any
 * other stray is reported, not refused: a restore reads only the files the manifests name, pinned
 * by digest, so a stray changes nothing it installs (damage to a named file is refused by its
 * digest). Crashed writers leave such files (their temps, a records file a lost race or a crash
 * left unnamed), which take disk until removed; anything else is worth a look. The rest of the
 * checkpoint directory is the controller's (its state file, and whatever else it keeps there): not checked.
 */
async function unreferencedFiles(dir: string, recordsFiles: ReadonlyMap<string, string>): Promise<UnreferencedFile[]> {
  const found: UnreferencedFile[] = [];
  const entries = async (path: string) => {
    try {
      return await readdir(path, { withFileTypes: true });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT" && recordsFiles.size === 0) return [];
      if (isUnreadableStorage(error)) throw error;
      throw bad(`${path === dir ? "the checkpoint directory" : path.slice(dir.length + 1)} cannot be listed`, error);
    }
  };
  const stray = (at: string, entry: Dirent) => {
    const kind = !entry.isFile() ? "other" : PARTICIPANT_TEMP.test(entry.name) ? "temp" : RECORDS_FILE_PATTERN.test(entry.name) ? "records" : "other";
    found.push({ path: `${at}/${entry.name}`, kind });
  };
  for (const top of await entries(dir)) {
    if (top.isFile() && isGlobalManifestTemp(top.name)) found.push({ path: top.name, kind: "temp" });
  }
  for (const kind of await entries(join(dir, PARTICIPANTS_DIR))) {
    const at = `${PARTICIPANTS_DIR}/${kind.name}`;
    if (kind.name.startsWith(".")) {
      stray(PARTICIPANTS_DIR, kind);
      continue;
    }
    if (!kind.isDirectory()) throw bad(`${at} is not a participant kind's directory`);
    for (const instance of await entries(join(dir, PARTICIPANTS_DIR, kind.name))) {
      if (instance.name.startsWith(".")) {
        stray(at, instance);
        continue;
      }
      const recordsFile = recordsFiles.get(`${kind.name}/${instance.name}`);
      if (recordsFile === undefined) throw bad(`${at}/${instance.name} holds a participant's files that checkpoint.json does not list`);
      // Listed: its manifest and records were read through this very directory.
      const own = `${at}/${instance.name}`;
      for (const file of await entries(join(dir, own))) {
        if (file.name === MANIFEST_FILE || file.name === recordsFile) continue;
        stray(own, file);
      }
    }
  }
  return found.sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}
