import { constants } from "node:buffer";
import { createHash } from "node:crypto";
import { realpath } from "node:fs/promises";
import { dirname, isAbsolute, join, normalize, sep } from "node:path";
import {
  CheckpointError,
  LineSplitter,
  MANIFEST_FILE,
  MAX_MANIFEST_BYTES,
  PARTICIPANTS_DIR,
  ParticipantManifestSchema,
  schemaVersionMismatch,
  RECORDS_FILE_PATTERN,
  RecordBaseSchema,
  canonicalDigest,
  captureKey,
  describeZodError,
  isUnreadableStorage,
  sha256Hex,
  type ParticipantManifest,
  type RecordBase,
} from "../../protocol/index.js";
import { openRegularFile, readRegularFileBytes } from "./regular-file.js";

const { MAX_STRING_LENGTH } = constants;

/**
 * What one participant committed into a checkpoint directory, read back and checked against its
 * entry (in checkpoint.json, or in the commit reply before publication): its manifest.json
 * (path, digest, identity, schema) and its records file (digest over every line with its newline,
 * line count, each line a JSON record with an episode_id). Any mismatch is invalid_checkpoint_state.
 */

/** The fields of a participant's entry (checkpoint.json, commit reply) that name its committed files. */
export interface CommittedEntry {
  kind: string;
  instance: string;
  manifest_path: string;
  manifest_sha256: string;
  records_sha256: string;
  record_count: number;
}

export function bad(detail: string, cause?: unknown): CheckpointError {
  return new CheckpointError("invalid_checkpoint_state", detail, cause === undefined ? {} : { cause });
}

/** `relativePath` resolved inside checkpoint directory `dir`; refused when absolute or leaving it. */
export function insideCheckpointDir(dir: string, relativePath: string, label: string): string {
  if (isAbsolute(relativePath)) throw bad(`${label}: path ${relativePath} must be relative`);
  const full = normalize(join(dir, relativePath));
  if (!full.startsWith(dir + sep)) throw bad(`${label}: path ${relativePath} leaves the checkpoint directory`);
  return full;
}

/** The participant's manifest, checked against `entry` (`source` names where the entry came from). */
export async function readCommittedManifest(
  dir: string,
  checkpointId: string,
  entry: CommittedEntry,
  source = "checkpoint.json",
): Promise<{ manifest: ParticipantManifest; recordsPath: string }> {
  const label = `${entry.kind}/${entry.instance}`;
  const manifestPath = insideCheckpointDir(dir, entry.manifest_path, label);
  if (manifestPath !== join(dir, PARTICIPANTS_DIR, entry.kind, entry.instance, MANIFEST_FILE)) {
    throw bad(`${label}: manifest_path ${entry.manifest_path} is not ${PARTICIPANTS_DIR}/${entry.kind}/${entry.instance}/${MANIFEST_FILE}`);
  }
  await refuseLinkedParticipantDir(dir, dirname(manifestPath), label);
  let bytes: Buffer;
  try {
    // Neither the manifest nor the records file may be a symbolic link (out of the checkpoint).
    bytes = await readRegularFileBytes(manifestPath, { maxBytes: MAX_MANIFEST_BYTES, noFollow: true });
  } catch (error) {
    if (error instanceof CheckpointError) throw bad(`${label}: manifest ${error.message}`, error);
    // There but unreadable (EACCES, EIO) is the storage's refusal (storage_error), as participants
    // answer it: not a checkpoint missing its manifest, which would send the operator to an older one.
    if (isUnreadableStorage(error)) throw error;
    throw bad(`${label}: manifest ${entry.manifest_path} is missing`, error);
  }
  // The bytes as stored, as the participant hashed what it wrote: a decoded string would map invalid
  // UTF-8 to U+FFFD, so a damaged manifest could hash like the committed one.
  if (sha256Hex(bytes) !== entry.manifest_sha256) throw bad(`${label}: manifest digest does not match ${source}`);
  let value: unknown;
  try {
    value = JSON.parse(bytes.toString("utf8"));
  } catch (error) {
    throw bad(`${label}: manifest is not JSON`, error);
  }
  const otherVersion = schemaVersionMismatch(value, `${label}: manifest ${entry.manifest_path}`);
  if (otherVersion) throw bad(otherVersion);
  const parsed = ParticipantManifestSchema.safeParse(value);
  if (!parsed.success) throw bad(`${label}: manifest is invalid: ${describeZodError(parsed.error)}`);
  const m = parsed.data;
  if (m.kind !== entry.kind || m.instance !== entry.instance) throw bad(`${label}: manifest belongs to ${m.kind}/${m.instance}`);
  if (m.checkpoint_id !== checkpointId) throw bad(`${label}: manifest belongs to checkpoint ${m.checkpoint_id}`);
  if (!RECORDS_FILE_PATTERN.test(m.records_file)) throw bad(`${label}: records_file ${m.records_file} has the wrong name`);
  if (m.records_sha256 !== entry.records_sha256 || m.record_count !== entry.record_count) {
    throw bad(`${label}: manifest digest or count disagrees with ${source}`);
  }
  return { manifest: m, recordsPath: join(manifestPath, "..", m.records_file) };
}

/**
 * A participant's directory must be where it seems: `gym/<kind>/<instance>` below the checkpoint
 * directory with no symbolic link on the way (participants refuse to write or restore through one;
 * a link put there later would make verify vouch for files outside the checkpoint). The checkpoint
 * root itself may be reached through a link (a mount point).
 */
async function refuseLinkedParticipantDir(dir: string, participantDir: string, label: string): Promise<void> {
  let real: string;
  let expected: string;
  try {
    [real, expected] = await Promise.all([realpath(participantDir), realpath(dir).then((d) => join(d, participantDir.slice(dir.length)))]);
  } catch (error) {
    if (isUnreadableStorage(error)) throw error;
    throw bad(`${label}: its directory ${participantDir.slice(dir.length + 1)} is missing`, error);
  }
  if (real !== expected) throw bad(`${label}: its directory ${participantDir.slice(dir.length + 1)} is reached through a symbolic link`);
}

/** Streams a records file, checking each line and handing it to `onRecord`; the caller compares digest and count. */
export async function scanRecords(
  path: string,
  label: string,
  onRecord?: (record: RecordBase) => void,
  maxLineBytes = MAX_STRING_LENGTH,
): Promise<{ digest: string; count: number; bytes: number }> {
  const hash = createHash("sha256");
  let count = 0;
  let bytes = 0;
  const splitter = new LineSplitter();
  const check = (line: string) => {
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch (error) {
      throw bad(`${label}: line ${count + 1} is not JSON`, error);
    }
    const parsed = RecordBaseSchema.safeParse(value);
    if (!parsed.success) throw bad(`${label}: line ${count + 1} has no valid episode_id: ${describeZodError(parsed.error)}`);
    onRecord?.(parsed.data);
    count++;
  };
  try {
    // No size limit (records are as large as the participant's state), but never a FIFO.
    const { handle } = await openRegularFile(path, { maxBytes: Number.MAX_SAFE_INTEGER, noFollow: true });
    for await (const chunk of handle.createReadStream() as AsyncIterable<Buffer>) {
      hash.update(chunk);
      bytes += chunk.byteLength;
      for (const line of splitter.push(chunk)) check(line.bytes.toString("utf8", 0, line.bytes.length - 1));
      // Damage that is one endless line is refused as soon as no record could be that long, not held whole first.
      if (splitter.pendingBytes > maxLineBytes) throw bad(`${label}: line ${count + 1} is longer than any record can be (over ${maxLineBytes} bytes without a newline)`);
    }
    // Inside the try: a last line too long for a string is damage, like any other unreadable line.
    const last = splitter.end();
    if (last) check(last.bytes.toString("utf8"));
  } catch (error) {
    if (error instanceof CheckpointError || isUnreadableStorage(error)) throw error;
    throw bad(`${label}: cannot read ${path}: ${(error as Error).message}`, error);
  }
  return { digest: hash.digest("hex"), count, bytes };
}

/**
 * One participant's committed manifest, and its records file's sha256 and line count checked
 * against it without parsing a record: what a restore checks before it sends anything, so damage
 * anywhere installs nothing anywhere. Hashing and counting newlines take a half to a third of the
 * time of `readCommittedRecords`, which also parses each record (verify, lost reply lists): 197 MiB
 * in 0.34–0.45 s against 0.75–1.35 s here. A record that does not parse is left to its participant's
 * refusal at install.
 */
export async function checkCommittedRecords(dir: string, checkpointId: string, entry: CommittedEntry): Promise<ParticipantManifest> {
  const label = `${entry.kind}/${entry.instance}`;
  const { manifest, recordsPath } = await readCommittedManifest(dir, checkpointId, entry);
  const hash = createHash("sha256");
  let lines = 0;
  let endsWithNewline = true;
  try {
    const { handle } = await openRegularFile(recordsPath, { maxBytes: Number.MAX_SAFE_INTEGER, noFollow: true });
    for await (const chunk of handle.createReadStream() as AsyncIterable<Buffer>) {
      hash.update(chunk);
      for (let at = chunk.indexOf(10); at !== -1; at = chunk.indexOf(10, at + 1)) lines++;
      if (chunk.byteLength) endsWithNewline = chunk[chunk.byteLength - 1] === 10;
    }
  } catch (error) {
    if (error instanceof CheckpointError || isUnreadableStorage(error)) throw error;
    throw bad(`${label}: cannot read ${recordsPath}: ${(error as Error).message}`, error);
  }
  const digest = hash.digest("hex");
  if (digest !== manifest.records_sha256) throw bad(`${label}: records digest ${digest} does not match ${manifest.records_sha256}`);
  const count = lines + (endsWithNewline ? 0 : 1);
  if (count !== manifest.record_count) throw bad(`${label}: records file has ${count} records; the manifest says ${manifest.record_count}`);
  return manifest;
}

/**
 * One participant's committed manifest and records, checked end to end against `entry` (`source`
 * names where it came from), with the capture keys its records name: what its commit reply lists
 * as `episode_ids` (sorted, unique; the control plane derives that list from the same records).
 */
export async function readCommittedRecords(
  dir: string,
  checkpointId: string,
  entry: CommittedEntry,
  source = "checkpoint.json",
): Promise<{ manifest: ParticipantManifest; episodeIds: string[]; count: number; bytes: number }> {
  const label = `${entry.kind}/${entry.instance}`;
  const { manifest, recordsPath } = await readCommittedManifest(dir, checkpointId, entry, source);
  const keys = new Set<string>();
  const scanned = await scanRecords(recordsPath, label, (record) => keys.add(captureKey(record.episode_id)));
  if (scanned.digest !== manifest.records_sha256) throw bad(`${label}: records digest ${scanned.digest} does not match ${manifest.records_sha256}`);
  if (scanned.count !== manifest.record_count) throw bad(`${label}: records file has ${scanned.count} records; the manifest says ${manifest.record_count}`);
  return { manifest, episodeIds: [...keys].sort(), count: scanned.count, bytes: scanned.bytes };
}

/**
 * The capture keys a participant exported, as its commit reply lists them (sorted, unique), read
 * from its committed records: for a reply that left the list out (docs/api.md, "Reply size"). The
 * result must match the reply's `episode_count` and `episode_ids_sha256`.
 */
export async function committedEpisodeIds(
  dir: string,
  checkpointId: string,
  entry: CommittedEntry & { episode_count?: number | undefined; episode_ids_sha256?: string | undefined },
): Promise<string[]> {
  const label = `${entry.kind}/${entry.instance}`;
  const ids = (await readCommittedRecords(dir, checkpointId, entry, "the commit reply")).episodeIds;
  if (entry.episode_count !== undefined && ids.length !== entry.episode_count) {
    throw bad(`${label}: its records name ${ids.length} episodes; the commit reply says ${entry.episode_count}`);
  }
  if (entry.episode_ids_sha256 !== undefined && canonicalDigest(ids) !== entry.episode_ids_sha256) {
    throw bad(`${label}: the episodes its records name do not match the commit reply's episode_ids_sha256`);
  }
  return ids;
}
