import { createHash } from "node:crypto";
import { promises as fs } from "node:fs";
import path from "node:path";
import { CheckpointError, MAX_ROLLOUT_BATCH_BYTES, MAX_ROLLOUT_STEP_MARKER_BYTES, encodeRecordLines, encodeRolloutRecords, encodeRolloutStepMarker, rolloutStepMarkerFiles, stepMarkerComplete, type EncodedRolloutRecords } from "../../protocol/index.js";
import { tempNameTarget, writeFileAtomic } from "../storage/fs-durable.js";
import { openRegularFile, readRegularFile } from "../storage/regular-file.js";
import { removeStaleTempFiles } from "../storage/stale-temp-files.js";
import { invalidRequest } from "./errors.js";
import { indexPathFor, isIndexFileName, parseRecordFileName, recordFileName, stepDirName, type RecordKind } from "./record-paths.js";
import { isStepMarkerName, stepMarkerName } from "./step-marker.js";
import type { TraceRecord } from "./trace-record.js";

/** Records of one env for one step. */
export interface EnvRecords {
  kind: RecordKind;
  env: string;
  traces: readonly TraceRecord[];
  /** Policy version that produced each rollout (the record itself does not carry it). */
  policyVersion?: number | null | ((trace: TraceRecord, position: number) => number | null);
}

export interface WrittenRecords {
  recordPath: string;
  indexPath: string;
  records: number;
  bytes: number;
}

/** Encodes records as JSON lines and returns each line's byte span (newline included). */
export async function encodeRecords(
  traces: readonly TraceRecord[],
): Promise<{ data: Buffer; spans: Array<{ offset: number; len: number }> }> {
  try {
    const { bytes, spans } = encodeRecordLines(traces);
    return { data: bytes, spans };
  } catch (error) {
    if (error instanceof CheckpointError) throw invalidRequest(error.message, { cause: error });
    throw error;
  }
}

/**
 * Writes <stepDir>/<kind>_rollouts_<env>.jsonl, then its index. Records are published first so an
 * index never points at bytes that do not exist yet. Invalid input is refused before anything is written.
 * A record file already published with exactly these bytes is kept (a retry), and its index is
 * written if it is missing or differs. A batch whose record file or index would be longer than one
 * Buffer (`maxBatchBytes`, smaller only in tests) is refused: write its records in more steps.
 */
export async function writeRolloutRecords(rootDir: string, step: number, batch: EnvRecords, maxBatchBytes = MAX_ROLLOUT_BATCH_BYTES): Promise<WrittenRecords> {
  const prepared = await prepare(rootDir, step, batch, maxBatchBytes);
  await removeStaleStepTemps(path.dirname(prepared.recordPath));
  return publish(prepared);
}

/**
 * Removes the temp files of a step's record files, indexes and markers (any writer's: the collector
 * names them alike) that a crash left before their rename or link; nothing else ever would. Only
 * those older than STALE_TEMP_AGE_MS: a younger one may be a live writer's, here or elsewhere.
 */
async function removeStaleStepTemps(stepDir: string): Promise<void> {
  await removeStaleTempFiles(stepDir, (name) => {
    const target = tempNameTarget(name);
    return target !== null && (parseRecordFileName(target) !== null || isIndexFileName(target) || isStepMarkerName(target));
  });
}

interface Prepared {
  recordPath: string;
  indexPath: string;
  data: Buffer;
  sha256: string;
  index: Buffer;
  records: number;
  /** The record file is already on disk with exactly these bytes (an earlier, interrupted attempt). */
  published: boolean;
}

/** Validates and encodes one env's records (the protocol's pure encoding); touches no file. */
async function prepare(rootDir: string, step: number, batch: EnvRecords, maxBatchBytes: number): Promise<Prepared> {
  const stepDir = path.join(rootDir, stepDirName(step));
  const recordPath = path.join(stepDir, recordFileName(batch.kind, batch.env));
  const indexPath = indexPathFor(recordPath)!;
  const pv = batch.policyVersion;
  const policyVersion = typeof pv === "function" ? batch.traces.map((trace, i) => pv(trace, i)) : (pv ?? null);
  let encoded: EncodedRolloutRecords;
  try {
    encoded = encodeRolloutRecords({ kind: batch.kind, env: batch.env, step, records: batch.traces, policyVersion }, maxBatchBytes);
  } catch (error) {
    if (error instanceof CheckpointError) throw invalidRequest(error.message, { cause: error });
    throw error;
  }
  // Steps are append-only: followers never re-read a file they consumed, so replacing one would
  // leave workers with different task lists. The same bytes again are a retry and are kept.
  const published = await holdsBytes(recordPath, encoded.header.size, encoded.header.sha256);
  if (published === false) throw invalidRequest(`step ${step} already has ${path.basename(recordPath)}; a published file is never replaced`);
  return {
    recordPath,
    indexPath,
    data: encoded.recordBytes,
    sha256: encoded.header.sha256,
    index: encoded.indexBytes,
    records: encoded.rows.length,
    published: published === true,
  };
}

async function publish(p: Prepared): Promise<WrittenRecords> {
  // Linked into place, never renamed over: a concurrent writer of the same file may have won since
  // prepare looked. Its bytes being ours makes this a retry; other bytes are refused, as in prepare.
  if (!p.published && !(await writeFileAtomic(p.recordPath, p.data, { exclusive: true }))) {
    if ((await holdsBytes(p.recordPath, p.data.length, p.sha256)) !== true) {
      throw invalidRequest(`${path.basename(path.dirname(p.recordPath))} already has ${path.basename(p.recordPath)}; a published file is never replaced`);
    }
  }
  // The attempt that published the records may have stopped before their index (derived, so safe to replace).
  if (!p.published || !(await sameBytes(p.indexPath, p.index))) await writeFileAtomic(p.indexPath, p.index);
  return { recordPath: p.recordPath, indexPath: p.indexPath, records: p.records, bytes: p.data.length };
}

/**
 * Writes every env of one step concurrently, then one step-complete marker per kind listing the
 * files, so a follower waiting for markers appends the step as a whole. A retry of an interrupted
 * step completes it: files it already published are kept, and each marker lists every record file
 * of its kind in the step directory (a file left unlisted would stop a follower for good).
 */
export async function writeStepRecords(
  rootDir: string,
  step: number,
  batches: readonly EnvRecords[],
  /** Every reader's marker limit; smaller only in tests. */
  maxMarkerBytes = MAX_ROLLOUT_STEP_MARKER_BYTES,
  /** One env's record file or index at most (one Buffer); smaller only in tests. */
  maxBatchBytes = MAX_ROLLOUT_BATCH_BYTES,
): Promise<WrittenRecords[]> {
  const names = batches.map((b) => `${b.kind}:${b.env}`);
  if (new Set(names).size !== names.length) throw invalidRequest("each (kind, env) may appear once per step");
  // Validate and encode every env before publishing any, so a refusal leaves the step untouched.
  const prepared: Prepared[] = [];
  for (const batch of batches) prepared.push(await prepare(rootDir, step, batch, maxBatchBytes));
  const stepDir = path.join(rootDir, stepDirName(step));
  // A marker no reader accepts would leave the step incomplete for followers for good: refused
  // before any file is published (a concurrent writer may still push it over: completeMarker refuses then).
  for (const kind of new Set(batches.map((b) => b.kind))) {
    const ours = prepared.filter((_, i) => batches[i]!.kind === kind).map((p) => path.basename(p.recordPath));
    encodeRolloutStepMarker(step, kind, (await markerListing(stepDir, step, kind, ours)).files, maxMarkerBytes);
  }
  await removeStaleStepTemps(stepDir);
  // Settle every publish before failing, so a retry never races a write of this call still under way.
  const settled = await Promise.allSettled(prepared.map(publish));
  const failed = settled.find((r) => r.status === "rejected");
  if (failed) throw failed.reason;
  const written = settled.map((r) => (r as PromiseFulfilledResult<WrittenRecords>).value);
  // Read after this call's files are published; includes files of an earlier, interrupted call.
  const present = await recordFilesIn(stepDir);
  for (const kind of new Set([...batches.map((b) => b.kind), ...present.map((f) => f.kind)])) await completeMarker(stepDir, step, kind, maxMarkerBytes);
  return written;
}

/** What the marker of `kind` would list with `extra` added: what it lists and the record files there. */
async function markerListing(stepDir: string, step: number, kind: RecordKind, extra: readonly string[] = []): Promise<{ listed: string[] | null; files: string[] }> {
  const listed = await markerFiles(path.join(stepDir, stepMarkerName(kind)), step, kind);
  const onDisk = (await recordFilesIn(stepDir)).filter((f) => f.kind === kind).map((f) => f.name);
  return { listed, files: [...new Set([...(listed ?? []), ...onDisk, ...extra])].sort() };
}

/** Read-merge-write rounds of a step marker before giving up (as the collector's records sink does). */
const MARKER_ROUNDS = 5;

/**
 * Makes the step's marker of `kind` list every record file of that kind in the step directory,
 * keeping what it listed. A step written in several calls, or by several writers at once (other
 * envs; a collector sharing the directory), merges one marker: a read-modify-write, so another
 * writer can replace it with a list computed before this call's file appeared. It is read again
 * after each write until it lists everything (whoever writes last checks last); a file left
 * unlisted would stop a follower waiting for markers for good.
 */
async function completeMarker(stepDir: string, step: number, kind: RecordKind, maxMarkerBytes: number): Promise<void> {
  const markerPath = path.join(stepDir, stepMarkerName(kind));
  for (let round = 0; round < MARKER_ROUNDS; round++) {
    const { listed, files } = await markerListing(stepDir, step, kind);
    if (stepMarkerComplete(listed, files)) return;
    await writeFileAtomic(markerPath, Buffer.from(encodeRolloutStepMarker(step, kind, files, maxMarkerBytes)));
  }
  // The step's files are all published: a retry of the call completes its marker.
  throw invalidRequest(`the ${stepMarkerName(kind)} of step ${step} kept losing files to concurrent writers (${MARKER_ROUNDS} rounds): retry the call to complete it`);
}

/**
 * Keeps record writing off the hot path: `enqueue` returns at once; steps are written one after
 * another in enqueue order (so steps appear on disk in order) and `flush` reports the first failure.
 */
export class RecordWriter {
  private tail: Promise<void> = Promise.resolve();
  private failure: unknown = undefined;
  /** The last step enqueued; null before the first. */
  private lastStep: number | null = null;

  constructor(private readonly rootDir: string) {}

  /**
   * The lists are copied now, so a caller may clear or reuse its buffers at once; the records
   * themselves are encoded later and must not change until `flush`. A step not after the last one
   * enqueued is refused (`invalid_request`, nothing queued): it would appear on disk after a later
   * step, which followers may already have consumed.
   */
  enqueue(step: number, given: readonly EnvRecords[]): void {
    if (this.lastStep !== null && !(step > this.lastStep)) throw invalidRequest(`step ${step} does not follow step ${this.lastStep}, the last one enqueued`);
    this.lastStep = step;
    const batches = given.map((batch) => ({ ...batch, traces: [...batch.traces] }));
    this.tail = this.tail.then(async () => {
      if (this.failure !== undefined) return; // a failed step stops later ones so steps never appear out of order
      try {
        await writeStepRecords(this.rootDir, step, batches);
      } catch (error) {
        this.failure = error;
      }
    });
  }

  async flush(): Promise<void> {
    await this.tail;
    if (this.failure !== undefined) throw this.failure;
  }
}

/** Whether `file` holds exactly the bytes of this size and sha256; null when there is no file. */
async function holdsBytes(file: string, size: number, sha256: string): Promise<boolean | null> {
  let opened: Awaited<ReturnType<typeof openRegularFile>>;
  try {
    // Never a FIFO or device (a read would wait for a writer for ever): that is not our file either.
    opened = await openRegularFile(file, { maxBytes: Number.MAX_SAFE_INTEGER });
  } catch (error) {
    if (error instanceof CheckpointError) return false;
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return null;
    throw error;
  }
  const { handle, info } = opened;
  try {
    if (info.size !== size) return false;
    const hash = createHash("sha256");
    for await (const chunk of handle.createReadStream({ autoClose: false }) as AsyncIterable<Buffer>) hash.update(chunk);
    return hash.digest("hex") === sha256;
  } finally {
    await handle.close();
  }
}

/** Whether `file` holds exactly `data`; a FIFO, device or larger file there does not (and is never waited on). */
async function sameBytes(file: string, data: Buffer): Promise<boolean> {
  try {
    return (await readRegularFile(file, { maxBytes: data.length })).equals(data);
  } catch (error) {
    if (error instanceof CheckpointError || (error as NodeJS.ErrnoException).code === "ENOENT") return false;
    throw error;
  }
}

/** Conventional record files in a step directory ([] when it does not exist). */
async function recordFilesIn(stepDir: string): Promise<Array<{ name: string; kind: RecordKind }>> {
  let names: string[];
  try {
    names = await fs.readdir(stepDir);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return [];
    throw error;
  }
  return names.flatMap((name) => {
    const parsed = parseRecordFileName(name);
    return parsed ? [{ name, kind: parsed.kind }] : [];
  });
}

/**
 * The files an existing marker lists; null when there is none, or it is not a valid marker (a regular
 * file within the limit) of this step and kind: rewritten then, since followers ignore it.
 */
async function markerFiles(file: string, step: number, kind: RecordKind): Promise<string[] | null> {
  try {
    return rolloutStepMarkerFiles(JSON.parse((await readRegularFile(file, { maxBytes: MAX_ROLLOUT_STEP_MARKER_BYTES })).toString("utf8")), step, kind);
  } catch {
    return null;
  }
}
