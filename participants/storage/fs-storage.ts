import { constants } from "node:buffer";
import { createHash, randomBytes } from "node:crypto";
import { link, mkdir, open, rename, unlink, type FileHandle } from "node:fs/promises";
import { join, relative } from "node:path";
import type { z } from "zod";
import {
  CheckpointError,
  LineSplitter,
  captureKey,
  MANIFEST_FILE,
  MANIFEST_SCHEMA_VERSION,
  MAX_MANIFEST_BYTES,
  PARTICIPANTS_DIR,
  ParticipantManifestSchema,
  schemaVersionMismatch,
  describeZodError,
  isUnreadableStorage,
  makeDirectories,
  namePath,
  parentsOfCreated,
  sha256Hex,
  type ParticipantManifest,
  type RecordBase,
  type SplitLine,
  jsonTextWithin,
} from "../../protocol/index.js";
import type { CheckpointStorage, ParticipantTarget, PinnedManifest, PinnedParticipant, ReadParticipant, WrittenParticipant } from "./checkpoint-storage.js";
import { fsyncDir } from "./fs-durable.js";
import { openRegularFile, readRegularFile } from "./regular-file.js";
import type { WriteGate } from "./write-gate.js";

const { MAX_STRING_LENGTH } = constants;

const WRITE_CHUNK_BYTES = 1 << 20;

/**
 * The whole chunk: a FileHandle write is one write(2), which on the last free blocks writes a
 * part without an error; the rest is written until done or refused (ENOSPC, EFBIG), so a short
 * records file is never taken for the one its digest names.
 */
async function writeAll(handle: FileHandle, chunk: Buffer): Promise<void> {
  for (let offset = 0; offset < chunk.byteLength; ) {
    const { bytesWritten } = await handle.write(chunk, offset);
    if (bytesWritten === 0) throw Object.assign(new Error("EIO: a write made no progress"), { code: "EIO", syscall: "write" });
    offset += bytesWritten;
  }
}

/** `<checkpoint_dir>/gym/<kind>/<instance>`; ids were validated as safe path components. */
export function participantDir(target: ParticipantTarget): string {
  return join(target.checkpointDir, PARTICIPANTS_DIR, target.kind, target.instance);
}

function corrupt(detail: string, cause?: unknown): CheckpointError {
  return new CheckpointError("invalid_checkpoint_state", detail, { cause });
}

/**
 * Makes `<checkpoint_dir>/gym/<kind>/<instance>` one component at a time, never `checkpoint_dir`
 * itself (mkdir -p would): the coordinator made it before the commit and the control plane saw it
 * on arrival, so one gone by the write (the checkpoint storage unmounted meanwhile, its mount
 * point's empty local directory left) is refused here, atomically, rather than made on the local
 * disk. Returns the first directory it created (as makeDirectories does), or undefined.
 */
async function makeParticipantDir(target: ParticipantTarget): Promise<string | undefined> {
  let path = target.checkpointDir;
  let first: string | undefined;
  for (const name of [PARTICIPANTS_DIR, target.kind, target.instance]) {
    path = join(path, name);
    try {
      await mkdir(path);
      first ??= path;
    } catch (error) {
      const code = (error as NodeJS.ErrnoException).code;
      // Something not a directory there fails the next mkdir (or the write) with ENOTDIR, a storage failure.
      if (code === "EEXIST") continue;
      if (code === "ENOENT" && name === PARTICIPANTS_DIR) {
        throw new CheckpointError(
          "storage_error",
          `ENOENT: checkpoint directory ${target.checkpointDir} is no longer visible on this host (is the checkpoint storage mounted here?); a commit does not create it, nothing was written`,
          { cause: error },
        );
      }
      throw error;
    }
  }
  return first;
}

/**
 * The longest records line, newline included: every reader (a restore, `verify`, `gym-ckpt seeds`)
 * decodes a line as one string, and Node bounds that by the line's UTF-8 bytes (a string of 2^28
 * CJK characters is one V8 holds, but its 768 MiB line decodes to none).
 */
export const MAX_RECORD_LINE_BYTES = MAX_STRING_LENGTH;

/** A record no reader could decode: refused before anything is published, naming it and the limit. */
function recordTooLarge(index: number, record: RecordBase, size: string, maxLineBytes: number): CheckpointError {
  return new CheckpointError(
    "payload_too_large",
    `record ${index} (${captureKey(record.episode_id)}) is ${size} as a JSON line, over the ${maxLineBytes}-byte limit every reader decodes; nothing was written (leave that episode out of the scope, or keep less of its state)`,
  );
}

/** One record's JSON line as bytes, refused (payload_too_large) when no reader could decode it. */
function recordLine(record: RecordBase, index: number, maxLineBytes: number): Buffer {
  // Longer than any string V8 makes: no reader could decode it either.
  const json = jsonTextWithin(record, () => recordTooLarge(index, record, "longer than the longest string", maxLineBytes));
  // Measured before the newline is appended: `json + "\n"` of a JSON exactly the longest string would throw.
  const size = Buffer.byteLength(json, "utf8") + 1;
  if (size > maxLineBytes) throw recordTooLarge(index, record, `${size} bytes`, maxLineBytes);
  const line = Buffer.allocUnsafe(size);
  line.write(json, 0, "utf8");
  line[size - 1] = 0x0a;
  return line;
}

/** The filesystem backend: one records file plus a create-only manifest per participant. */
export class FsCheckpointStorage implements CheckpointStorage {
  /** The longest records line written (MAX_RECORD_LINE_BYTES, smaller only in tests). */
  private readonly maxRecordLineBytes: number;

  constructor(options: { maxRecordLineBytes?: number } = {}) {
    this.maxRecordLineBytes = options.maxRecordLineBytes ?? MAX_RECORD_LINE_BYTES;
  }

  /**
   * Directories holding an entry a write created whose fsync has not succeeded yet (a failed fsync
   * or mkdir): a retry finds the directories there and creates nothing, so it fsyncs these instead.
   */
  private readonly unsynced = new Set<string>();

  async write(
    target: ParticipantTarget,
    records: readonly RecordBase[],
    options: { gate: WriteGate; createdAt: number; extra: Record<string, unknown>; existingCheckpointDir?: boolean },
  ): Promise<WrittenParticipant> {
    const dir = participantDir(target);
    // A new directory's entry lives in its parent: fsync those now, or LATEST can survive a power
    // loss that drops `gym/<kind>/<instance>`. Those a failed attempt left unsynced are fsynced by
    // its retry, which creates nothing.
    const mayCreate = parentsOfCreated(dir, options.existingCheckpointDir ? join(target.checkpointDir, PARTICIPANTS_DIR) : target.checkpointDir);
    let created: string[];
    try {
      created = parentsOfCreated(dir, options.existingCheckpointDir ? await makeParticipantDir(target) : await makeDirectories(dir));
    } catch (error) {
      for (const parent of mayCreate) this.unsynced.add(parent); // it may have created some before failing
      throw error;
    }
    for (const parent of created) this.unsynced.add(parent);
    for (const parent of new Set([...created, ...mayCreate])) {
      if (!this.unsynced.has(parent)) continue;
      await fsyncDir(parent);
      this.unsynced.delete(parent);
    }
    const suffix = `${process.pid}.${randomBytes(6).toString("hex")}`;
    const tempRecords = join(dir, `.records.jsonl.${suffix}`);
    const hash = createHash("sha256");
    let bytes = 0;
    const handle = await open(tempRecords, "wx");
    let writing: Promise<unknown> = Promise.resolve();
    try {
      // Each line is encoded on its own (JSON.stringify gives a flat string, which encodes at
      // copy speed; joined lines form a rope that must be flattened first, several times slower),
      // gathered into ~1 MiB chunks hashed once each; a chunk's write runs in the thread pool while
      // the next is serialized.
      let pending: Buffer[] = [];
      let pendingBytes = 0;
      const flush = async () => {
        const chunk = Buffer.concat(pending, pendingBytes);
        pending = [];
        pendingBytes = 0;
        hash.update(chunk);
        await writing;
        writing = writeAll(handle, chunk);
        writing.catch(() => undefined); // observed by the next flush, or below
        bytes += chunk.byteLength;
      };
      for (const [index, record] of records.entries()) {
        options.gate.throwIfStopped();
        const line = recordLine(record, index, this.maxRecordLineBytes);
        pending.push(line);
        pendingBytes += line.byteLength;
        if (pendingBytes >= WRITE_CHUNK_BYTES) await flush();
      }
      if (pending.length > 0) await flush();
      await writing;
      await handle.sync();
    } catch (error) {
      await writing.catch(() => undefined); // not closed under a write in flight
      await handle.close();
      await unlink(tempRecords).catch(() => undefined);
      throw namePath(error, tempRecords); // a handle's errors (ENOSPC on write) name no path
    }
    await handle.close();

    const digest = hash.digest("hex");
    const recordsFile = `records-${digest}.jsonl`;
    const manifest: ParticipantManifest = {
      schema_version: MANIFEST_SCHEMA_VERSION,
      kind: target.kind,
      instance: target.instance,
      checkpoint_id: target.checkpointId,
      records_file: recordsFile,
      records_sha256: digest,
      record_count: records.length,
      created_at: options.createdAt,
      extra: options.extra,
    };
    const manifestText = `${JSON.stringify(manifest, null, 2)}\n`;
    const manifestPath = join(dir, MANIFEST_FILE);
    // Every reader (restore, verify, seeds) refuses a larger manifest: published, it would make a
    // checkpoint (LATEST, even) that no restore can read. Only an adapter's `extra` can grow it.
    const manifestBytes = Buffer.byteLength(manifestText);
    if (manifestBytes > MAX_MANIFEST_BYTES) {
      await unlink(tempRecords).catch(() => undefined);
      throw new CheckpointError("payload_too_large", `${manifestPath} would be ${manifestBytes} bytes, over the ${MAX_MANIFEST_BYTES}-byte limit its readers enforce (the adapter's manifest extra is too large)`);
    }

    try {
      await options.gate.publish(async () => {
        // A digest-named file never changes once named, so renaming over an identical one is harmless.
        await rename(tempRecords, join(dir, recordsFile));
        try {
          await this.createManifest(dir, manifestPath, manifestText, suffix);
        } catch (error) {
          if (error instanceof CheckpointError && error.code === "checkpoint_conflict") await dropUnnamedRecords(dir, recordsFile);
          throw error;
        }
        await fsyncDir(dir);
      });
    } finally {
      await unlink(tempRecords).catch(() => undefined);
    }
    return {
      manifest,
      manifestPath: relative(target.checkpointDir, manifestPath),
      manifestSha256: sha256Hex(manifestText),
      bytes,
    };
  }

  /** Create-only publication: a hard link never replaces a name, so one of two racing writers wins. */
  private async createManifest(dir: string, manifestPath: string, text: string, suffix: string): Promise<void> {
    const temp = join(dir, `.manifest.json.${suffix}`);
    const handle = await open(temp, "wx");
    // Every way out removes the temp file, a failed write or fsync (ENOSPC, EIO) included.
    try {
      try {
        await handle.writeFile(text);
        await handle.sync();
      } finally {
        await handle.close();
      }
      try {
        await link(temp, manifestPath);
      } catch (error) {
        if ((error as NodeJS.ErrnoException).code !== "EEXIST") throw error;
        // Read at most as many bytes as ours: a manifest of another size (a huge one too) differs
        // anyway, and so does a symlink or anything but a regular file (refused unread).
        const existing = await readRegularFile(manifestPath, { maxBytes: Buffer.byteLength(text), noFollow: true }).catch((cause: unknown) => {
          if (cause instanceof CheckpointError) return undefined;
          throw cause;
        });
        // Compared as bytes: decoding maps invalid UTF-8 to U+FFFD, so other bytes could read as our text,
        // and the reply would pin a manifest_sha256 the file does not have.
        if (!existing?.equals(Buffer.from(text, "utf8"))) {
          throw new CheckpointError("checkpoint_conflict", `${manifestPath} already exists with different content`);
        }
      }
    } catch (error) {
      throw namePath(error, temp);
    } finally {
      await unlink(temp).catch(() => undefined);
    }
  }

  async read<R extends RecordBase>(
    target: ParticipantTarget,
    schema: z.ZodType<R>,
    keep: (record: R) => boolean = () => true,
    pinned?: PinnedManifest | PinnedParticipant,
  ): Promise<ReadParticipant<R>> {
    const dir = participantDir(target);
    const { manifest, sha256 } = await loadParticipantManifest(dir);
    if (pinned) {
      const label = `${target.kind}/${target.instance}`;
      if (sha256 !== pinned.manifest_sha256) throw corrupt(`${label}: manifest digest does not match checkpoint.json`);
      if ("records_sha256" in pinned && (manifest.records_sha256 !== pinned.records_sha256 || manifest.record_count !== pinned.record_count)) {
        throw corrupt(`${label}: manifest records digest or count disagrees with checkpoint.json`);
      }
    }
    if (manifest.kind !== target.kind || manifest.instance !== target.instance) {
      throw corrupt(`manifest belongs to ${manifest.kind}/${manifest.instance}, not ${target.kind}/${target.instance}`);
    }
    if (manifest.checkpoint_id !== target.checkpointId) {
      throw corrupt(`manifest belongs to checkpoint ${manifest.checkpoint_id}, not ${target.checkpointId}`);
    }
    const records: R[] = [];
    const { bytes, count, digest } = await scanRecordLines(
      join(dir, manifest.records_file),
      (line, index) => {
        let value: unknown;
        try {
          value = JSON.parse(line);
        } catch (error) {
          throw corrupt(`line ${index + 1} is not JSON`, error);
        }
        const parsed = schema.safeParse(value);
        if (!parsed.success) throw corrupt(`line ${index + 1} is invalid: ${describeZodError(parsed.error)}`);
        if (keep(parsed.data)) records.push(parsed.data);
      },
      this.maxRecordLineBytes,
    );
    if (digest !== manifest.records_sha256) throw corrupt(`records digest ${digest} does not match the manifest's ${manifest.records_sha256}`);
    if (count !== manifest.record_count) throw corrupt(`records file has ${count} records; the manifest says ${manifest.record_count}`);
    return { manifest, manifestSha256: sha256, records, bytes };
  }
}

/**
 * Another manifest was published first (reference §4.1 step 8): our records file goes unless that
 * manifest names the same file (digest-named: then it is its records, byte for byte).
 */
async function dropUnnamedRecords(dir: string, recordsFile: string): Promise<void> {
  const named = await readParticipantManifest(dir).then(
    (manifest) => manifest.records_file,
    () => undefined,
  );
  if (named !== recordsFile) await unlink(join(dir, recordsFile)).catch(() => undefined);
}

/** Reads and validates `<dir>/manifest.json`; a failure is `invalid_checkpoint_state`, but a read the storage refused (`isUnreadableStorage`: storage_error). */
export async function readParticipantManifest(dir: string): Promise<ParticipantManifest> {
  return (await loadParticipantManifest(dir)).manifest;
}

/** The manifest and the sha256 of the exact bytes it was parsed from (what checkpoint.json pins). */
async function loadParticipantManifest(dir: string): Promise<{ manifest: ParticipantManifest; sha256: string }> {
  const path = join(dir, MANIFEST_FILE);
  let bytes: Buffer;
  try {
    // Never a FIFO or device (a restore would block on it), never past the limit, never through a
    // symlink (it could point out of the checkpoint root).
    bytes = await readRegularFile(path, { maxBytes: MAX_MANIFEST_BYTES, noFollow: true });
  } catch (error) {
    if (error instanceof CheckpointError) throw corrupt(`manifest ${error.message}`, error);
    // A read the storage refused is passed on (storage_error): another checkpoint would fail alike.
    if (isUnreadableStorage(error)) throw error;
    throw corrupt(`no manifest at ${path}`, error);
  }
  let value: unknown;
  try {
    value = JSON.parse(bytes.toString("utf8"));
  } catch (error) {
    throw corrupt(`manifest ${path} is not valid JSON`, error);
  }
  const otherVersion = schemaVersionMismatch(value, `manifest ${path}`);
  if (otherVersion) throw corrupt(otherVersion);
  const parsed = ParticipantManifestSchema.safeParse(value);
  if (!parsed.success) throw corrupt(`manifest ${path} is invalid: ${describeZodError(parsed.error)}`);
  return { manifest: parsed.data, sha256: sha256Hex(bytes) };
}

/**
 * Streams a records file line by line, hashing the exact bytes (newline included) so the digest
 * covers the whole file even when only some records are kept. A final line without a newline is
 * still hashed and counted, so truncation shows up as a digest mismatch.
 */
export async function scanRecordLines(
  path: string,
  onLine: (line: string, index: number) => void,
  maxLineBytes = MAX_RECORD_LINE_BYTES,
): Promise<{ bytes: number; count: number; digest: string }> {
  const hash = createHash("sha256");
  let bytes = 0;
  let count = 0;
  const splitter = new LineSplitter();
  const text = (line: SplitLine) => (line.terminated ? line.bytes.subarray(0, -1) : line.bytes).toString("utf8");
  // The final line too: a line too long for a string must be invalid_checkpoint_state, not internal.
  try {
    // No size limit (records are as large as the participant's state), but never a FIFO or device,
    // never through a symlink.
    const { handle } = await openRegularFile(path, { maxBytes: Number.MAX_SAFE_INTEGER, noFollow: true });
    // The stream closes the handle when it ends or fails.
    for await (const chunk of handle.createReadStream() as AsyncIterable<Buffer>) {
      hash.update(chunk);
      bytes += chunk.byteLength;
      for (const line of splitter.push(chunk)) onLine(text(line), count++);
      // Damage that is one endless line (no newline for GBs) is refused as soon as no record could
      // be that long, not held whole in memory first.
      if (splitter.pendingBytes > maxLineBytes) throw corrupt(`${path}: line ${count + 1} is longer than any record can be (over ${maxLineBytes} bytes without a newline)`);
    }
    const last = splitter.end();
    if (last) onLine(text(last), count++);
  } catch (error) {
    if (error instanceof CheckpointError || isUnreadableStorage(error)) throw error;
    throw corrupt(`cannot read ${path}: ${(error as Error).message}`, error);
  }
  return { bytes, count, digest: hash.digest("hex") };
}
