import { constants } from "node:buffer";
import { createHash } from "node:crypto";
import type { FileHandle } from "node:fs/promises";
import path from "node:path";
import type { Logger } from "pino";
import { CheckpointError, LineSplitter } from "../../protocol/index.js";
import { openRegularFile, readRegularFile } from "../storage/regular-file.js";
import { describeIssues, invalidState } from "./errors.js";
import { defaultLogger } from "./log.js";
import { checkIndex, type IndexRow } from "./rollout-index.js";
import { indexPathFor, parseRecordFileName, stepOfPath } from "./record-paths.js";
import { branchCount, traceReward } from "./trace-graph.js";
import { TraceRecordSchema, type TraceRecord } from "./trace-record.js";

/** Seeds are named with these prefixes; records of replayed tasks are never replayed again. */
export const REPLAY_NAME_PREFIXES = ["continue:", "recheck:"] as const;

export interface RecordFilters {
  /** Inclusive bounds on the source rollout's reward; null is open. */
  minReward: number | null;
  maxReward: number | null;
  /** 2 for continue/compaction (a restart needs a second branch), else 1. */
  minBranches: number;
}

export type SkipReason = "replayed" | "empty" | "source_reward" | "no_seed";

/**
 * The one selection predicate, applied to an index row before reading and to every parsed record
 * after. Using the same function on the same derived fields keeps index filtering a strict subset
 * of the parse-side checks, so the indexed and full-parse paths yield the same records.
 */
export function selectionSkip(
  fields: { taskName: string | null; reward: number; branches: number },
  filters: RecordFilters,
): SkipReason | null {
  const name = fields.taskName ?? "";
  if (REPLAY_NAME_PREFIXES.some((prefix) => name.startsWith(prefix))) return "replayed";
  if (fields.branches === 0) return "empty";
  if (filters.minReward !== null && fields.reward < filters.minReward) return "source_reward";
  if (filters.maxReward !== null && fields.reward > filters.maxReward) return "source_reward";
  if (fields.branches < filters.minBranches) return "no_seed";
  return null;
}

/** Parse-side checks: the index predicate plus what only the record shows (explicit replay lineage). */
export function recordSkip(trace: TraceRecord, filters: RecordFilters): SkipReason | null {
  if (trace.info?.["replay"] !== undefined) return "replayed";
  return selectionSkip({ taskName: trace.task.name, reward: traceReward(trace), branches: branchCount(trace) }, filters);
}

export interface ReadStats {
  files: number;
  filesIndexed: number;
  filesFullParsed: number;
  indexRejected: number;
  /** Record-file bytes read from disk (spans, whole files, or hashing). */
  bytesRead: number;
  /** Record-file bytes handed to JSON.parse. */
  bytesParsed: number;
  indexBytesRead: number;
  spansRead: number;
  records: number;
  tornLines: number;
  skipped: Record<SkipReason, number>;
}

export function newReadStats(): ReadStats {
  return {
    files: 0,
    filesIndexed: 0,
    filesFullParsed: 0,
    indexRejected: 0,
    bytesRead: 0,
    bytesParsed: 0,
    indexBytesRead: 0,
    spansRead: 0,
    records: 0,
    tornLines: 0,
    skipped: { replayed: 0, empty: 0, source_reward: 0, no_seed: 0 },
  };
}

export function addReadStats(into: ReadStats, from: ReadStats): void {
  for (const key of Object.keys(from) as Array<keyof ReadStats>) {
    if (key === "skipped") {
      for (const reason of Object.keys(from.skipped) as SkipReason[]) into.skipped[reason] += from.skipped[reason];
    } else {
      into[key] += from[key];
    }
  }
}

export interface LoadedRecord {
  trace: TraceRecord;
  file: string;
  /** Position of the record's line among the file's lines (0-based). */
  ordinal: number;
  offset: number;
  len: number;
}

export interface ReadOptions {
  filters: RecordFilters;
  stats?: ReadStats;
  /** false forces a full parse (used to fall back when an index turns out to disagree with its file). */
  useIndex?: boolean;
  /** Also hash the whole record file against the index header's sha256 (reads every byte, parses none). */
  verifySha256?: boolean;
  logger?: Logger;
}

const CHUNK = 4 << 20;
const { MAX_STRING_LENGTH } = constants;

/**
 * Upper bound on an index's size for a record file of `recordBytes`. Never past the longest string:
 * the index is decoded as one, and a larger one (beside a record file over 128 MiB) would throw
 * instead of being ignored.
 */
export function maxIndexBytes(recordBytes: number): number {
  return Math.min((1 << 20) + 4 * recordBytes, MAX_STRING_LENGTH);
}

/**
 * Yields the selected records of one file. With a valid index only the selected spans are read
 * (fs read at offsets) and parsed; otherwise the whole file is parsed line by line. A survivor whose
 * bytes disagree with its index row throws invalid_checkpoint_state with reason "index_mismatch".
 */
export async function* readRecords(file: string, options: ReadOptions): AsyncGenerator<LoadedRecord> {
  const stats = options.stats ?? newReadStats();
  const logger = options.logger ?? defaultLogger();
  const handle = await openRecordFile(file);
  try {
    stats.files += 1;
    const size = (await handle.stat()).size; // fstat of the handle we read from: no race with a rename
    const rows = options.useIndex === false ? null : await loadIndex(file, handle, size, stats, logger, options.verifySha256 ?? false);
    if (rows) {
      stats.filesIndexed += 1;
      yield* readSpans(file, handle, rows, options.filters, stats);
    } else {
      stats.filesFullParsed += 1;
      yield* parseAll(file, handle, size, options.filters, stats, logger);
    }
  } finally {
    await handle.close();
  }
}

/**
 * The record file, never a FIFO or device (a glob checks the type, but the name can be replaced
 * before the open): refused with invalid_checkpoint_state. A missing file throws the open's ENOENT.
 */
async function openRecordFile(file: string): Promise<FileHandle> {
  try {
    return (await openRegularFile(file, { maxBytes: Number.MAX_SAFE_INTEGER })).handle;
  } catch (error) {
    if (error instanceof CheckpointError) throw invalidState(error.message);
    throw error;
  }
}

async function loadIndex(
  file: string,
  handle: FileHandle,
  size: number,
  stats: ReadStats,
  logger: Logger,
  verifySha256: boolean,
): Promise<IndexRow[] | null> {
  const indexPath = indexPathFor(file);
  const names = parseRecordFileName(path.basename(file));
  if (indexPath === null || names === null) return null;
  let bytes: Buffer;
  try {
    // An index row is far smaller than the record it describes; a much larger index is hostile.
    // A FIFO or device there is too: it is refused unread instead of blocking or streaming forever.
    bytes = await readRegularFile(indexPath, { maxBytes: maxIndexBytes(size) });
  } catch (error) {
    if (!(error instanceof CheckpointError)) return null; // not written yet (records are published first) or never: parse in full
    stats.indexRejected += 1;
    logger.warn({ file, index: indexPath, reason: error.message }, "ignoring rollout index; parsing the record file in full");
    return null;
  }
  stats.indexBytesRead += bytes.length;
  const expect = { recordFile: path.basename(file), kind: names.kind, env: names.env, step: stepOfPath(file), size };
  const check = checkIndex(bytes, expect); // its lines decoded one by one: never the whole index as one string
  let reason = check.ok ? null : check.reason;
  if (check.ok && verifySha256) {
    const digest = await hashHandle(handle, size, stats);
    if (digest !== check.header.sha256) reason = "sha256 differs from the record file";
  }
  if (reason !== null || !check.ok) {
    stats.indexRejected += 1;
    logger.warn({ file, index: indexPath, reason }, "ignoring rollout index; parsing the record file in full");
    return null;
  }
  return check.rows;
}

async function hashHandle(handle: FileHandle, size: number, stats: ReadStats): Promise<string> {
  const hash = createHash("sha256");
  const buffer = Buffer.allocUnsafe(CHUNK);
  for (let position = 0; position < size; ) {
    const { bytesRead } = await handle.read(buffer, 0, Math.min(CHUNK, size - position), position);
    if (bytesRead === 0) break;
    hash.update(buffer.subarray(0, bytesRead));
    position += bytesRead;
    stats.bytesRead += bytesRead;
  }
  return hash.digest("hex");
}

async function* readSpans(
  file: string,
  handle: FileHandle,
  rows: readonly IndexRow[],
  filters: RecordFilters,
  stats: ReadStats,
): AsyncGenerator<LoadedRecord> {
  for (const [ordinal, row] of rows.entries()) {
    const skip = selectionSkip({ taskName: row.task_name, reward: row.reward, branches: row.branches }, filters);
    if (skip) {
      stats.skipped[skip] += 1; // filtered spans are never read
      continue;
    }
    const where = `${file}:${ordinal + 1}`;
    // A span no string decodes from is no record line (nor one a Buffer could hold): the index's
    // fault, refused before a byte of it is read, so the loader parses in full.
    if (row.len > MAX_STRING_LENGTH) throw mismatch(where, `span of ${row.len} bytes is longer than any record can be`);
    const bytes = Buffer.allocUnsafe(row.len);
    let got = 0;
    while (got < row.len) {
      const { bytesRead } = await handle.read(bytes, got, row.len - got, row.offset + got);
      if (bytesRead === 0) break;
      got += bytesRead;
    }
    stats.bytesRead += got;
    stats.spansRead += 1;
    // One whole line: a newline at the end and nowhere before it (a stale index can end a span on
    // another record's newline); anything that then does not parse is the index's fault too.
    if (got !== row.len || bytes.indexOf(0x0a) !== row.len - 1) throw mismatch(where, "span is not one whole line");
    let trace: ReturnType<typeof parseLine>;
    try {
      trace = parseLine(bytes, where, stats);
    } catch (error) {
      throw mismatch(where, `span does not hold a record: ${error instanceof Error ? error.message : String(error)}`);
    }
    if (
      trace.id !== row.trace ||
      trace.task.idx !== row.task_idx ||
      trace.task.name !== row.task_name ||
      traceReward(trace) !== row.reward ||
      branchCount(trace) !== row.branches
    ) {
      throw mismatch(where, "record differs from its index row");
    }
    const parseSkip = recordSkip(trace, filters);
    if (parseSkip) {
      stats.skipped[parseSkip] += 1;
      continue;
    }
    stats.records += 1;
    yield { trace, file, ordinal, offset: row.offset, len: row.len };
  }
}

function mismatch(where: string, what: string) {
  return invalidState(`${where}: ${what}; the index is stale`, { reason: "index_mismatch" });
}

async function* parseAll(
  file: string,
  handle: FileHandle,
  size: number,
  filters: RecordFilters,
  stats: ReadStats,
  logger: Logger,
): AsyncGenerator<LoadedRecord> {
  let ordinal = 0;
  const take = (line: Buffer, offset: number, last: boolean): LoadedRecord | null => {
    const current = ordinal++;
    if (isBlank(line)) return null;
    const where = `${file}:${current + 1}`;
    const torn = last && line[line.length - 1] !== 0x0a;
    let trace: TraceRecord;
    try {
      trace = parseLine(line, where, stats);
    } catch (error) {
      // An append-mode writer may be mid-line: tolerate a torn, newline-less final line. No prefix
      // of a record's object parses, so a last line that is JSON is whole, and no record is corrupt.
      if (!torn || isJson(line)) throw error;
      stats.tornLines += 1;
      logger.warn({ file, line: current + 1 }, "skipping torn last line");
      return null;
    }
    const skip = recordSkip(trace, filters);
    if (skip) {
      stats.skipped[skip] += 1;
      return null;
    }
    stats.records += 1;
    return { trace, file, ordinal: current, offset, len: line.length };
  };

  const splitter = new LineSplitter();
  // Up to the size fstat gave, as the index path: bytes an append-mode writer adds meanwhile are
  // not this read's (a writer that never stops would otherwise keep it reading for ever).
  for (let position = 0; position < size; ) {
    const chunk = Buffer.allocUnsafe(Math.min(CHUNK, size - position));
    const { bytesRead } = await handle.read(chunk, 0, chunk.length, position);
    if (bytesRead === 0) break;
    position += bytesRead;
    stats.bytesRead += bytesRead;
    for (const line of splitter.push(chunk.subarray(0, bytesRead))) {
      const record = take(line.bytes, line.offset, false);
      if (record) yield record;
    }
    // No longer line decodes to a string, so none is a record: refused now rather than buffered
    // whole (a file with no newline would otherwise be held in memory entire).
    if (splitter.pendingBytes > MAX_STRING_LENGTH) {
      throw invalidState(`${file}:${ordinal + 1}: line is longer than any record can be (over ${MAX_STRING_LENGTH} bytes)`);
    }
  }
  const last = splitter.end();
  if (last) {
    const record = take(last.bytes, last.offset, true);
    if (record) yield record;
  }
}

function isBlank(line: Buffer): boolean {
  for (const byte of line) if (byte !== 0x20 && byte !== 0x0a && byte !== 0x0d && byte !== 0x09) return false;
  return true;
}

function isJson(bytes: Buffer): boolean {
  try {
    JSON.parse(bytes.toString("utf8"));
    return true;
  } catch {
    return false;
  }
}

/** JSON-parses one line and validates it as a rollout record; counts the bytes parsed. */
function parseLine(bytes: Buffer, where: string, stats: ReadStats): TraceRecord {
  stats.bytesParsed += bytes.length;
  let raw: unknown;
  try {
    raw = JSON.parse(bytes.toString("utf8"));
  } catch (cause) {
    throw invalidState(`${where}: not a JSON rollout record`, { cause });
  }
  const trace = TraceRecordSchema.safeParse(raw);
  if (!trace.success) throw invalidState(`${where}: not a rollout record: ${describeIssues(trace.error.issues)}`);
  return trace.data;
}
