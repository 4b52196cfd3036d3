import { CheckpointError, type GlobalManifest } from "../../protocol/index.js";
import type { CheckpointCatalog } from "./checkpoint-catalog.js";
import { bad, insideCheckpointDir, readCommittedManifest, scanRecords } from "./committed-records.js";
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
 * Re-reads a published checkpoint end to end: the global manifest, every participant manifest (its
 * digest as recorded globally, identity, schema), every records file (sha256 over every line with
 * its newline, line count, each line a JSON record with an episode_id) and the controller state
 * file. Throws a CheckpointError naming the first mismatch.
 */
export async function verifyCheckpoint(catalog: CheckpointCatalog, checkpointId: string): Promise<VerifyReport> {
  const manifest: GlobalManifest = await catalog.get(checkpointId);
  const dir = catalog.dirFor(checkpointId);
  const participants: VerifiedParticipant[] = [];
  for (const entry of manifest.participants) {
    const label = `${entry.kind}/${entry.instance}`;
    const { manifest: m, recordsPath } = await readCommittedManifest(dir, checkpointId, entry);
    const scanned = await scanRecords(recordsPath, label);
    if (scanned.digest !== m.records_sha256) throw bad(`${label}: records digest ${scanned.digest} does not match ${m.records_sha256}`);
    if (scanned.count !== m.record_count) throw bad(`${label}: records file has ${scanned.count} records; the manifest says ${m.record_count}`);
    participants.push({ kind: entry.kind, instance: entry.instance, records: scanned.count, bytes: scanned.bytes });
  }
  const state = manifest.controller_state;
  if (state && "file" in state) {
    let digest: string;
    try {
      insideCheckpointDir(dir, state.file, "controller state");
      digest = await controllerStateDigest(dir, state.file);
    } catch (error) {
      if (error instanceof CheckpointError) throw error;
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
