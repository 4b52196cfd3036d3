import { promises as fs } from "node:fs";
import path from "node:path";
import { CheckpointError, encodeRecordLines, encodeRolloutRecords, type EncodedRolloutRecords } from "../../protocol/index.js";
import { writeFileAtomic } from "../storage/fs-durable.js";
import { invalidRequest } from "./errors.js";
import { indexPathFor, recordFileName, stepDirName, type RecordKind } from "./record-paths.js";
import { StepMarkerSchema, stepMarkerName } from "./step-marker.js";
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
  const { bytes, spans } = encodeRecordLines(traces);
  return { data: bytes, spans };
}

/**
 * Writes <stepDir>/<kind>_rollouts_<env>.jsonl, then its index. Records are published first so an
 * index never points at bytes that do not exist yet. Invalid input is refused before anything is written.
 */
export async function writeRolloutRecords(rootDir: string, step: number, batch: EnvRecords): Promise<WrittenRecords> {
  return publish(await prepare(rootDir, step, batch));
}

interface Prepared {
  recordPath: string;
  indexPath: string;
  data: Buffer;
  index: Buffer;
  records: number;
}

/** Validates and encodes one env's records (the protocol's pure encoding); touches no file. */
async function prepare(rootDir: string, step: number, batch: EnvRecords): Promise<Prepared> {
  const stepDir = path.join(rootDir, stepDirName(step));
  const recordPath = path.join(stepDir, recordFileName(batch.kind, batch.env));
  const indexPath = indexPathFor(recordPath)!;
  // Steps are append-only: followers never re-read a file they consumed, so replacing one would
  // leave workers with different task lists.
  if (await exists(recordPath)) throw invalidRequest(`step ${step} already has ${path.basename(recordPath)}; a published file is never replaced`);
  const pv = batch.policyVersion;
  const policyVersion = typeof pv === "function" ? batch.traces.map((trace, i) => pv(trace, i)) : (pv ?? null);
  let encoded: EncodedRolloutRecords;
  try {
    encoded = encodeRolloutRecords({ kind: batch.kind, env: batch.env, step, records: batch.traces, policyVersion });
  } catch (error) {
    if (error instanceof CheckpointError) throw invalidRequest(error.message, { cause: error });
    throw error;
  }
  return { recordPath, indexPath, data: encoded.recordBytes, index: encoded.indexBytes, records: encoded.rows.length };
}

async function publish(p: Prepared): Promise<WrittenRecords> {
  await writeFileAtomic(p.recordPath, p.data);
  await writeFileAtomic(p.indexPath, p.index);
  return { recordPath: p.recordPath, indexPath: p.indexPath, records: p.records, bytes: p.data.length };
}

/**
 * Writes every env of one step concurrently, then one step-complete marker per kind listing the
 * files, so a follower waiting for markers appends the step as a whole.
 */
export async function writeStepRecords(
  rootDir: string,
  step: number,
  batches: readonly EnvRecords[],
): Promise<WrittenRecords[]> {
  const names = batches.map((b) => `${b.kind}:${b.env}`);
  if (new Set(names).size !== names.length) throw invalidRequest("each (kind, env) may appear once per step");
  // Validate and encode every env before publishing any, so a refusal leaves the step untouched.
  const prepared: Prepared[] = [];
  for (const batch of batches) prepared.push(await prepare(rootDir, step, batch));
  const written = await Promise.all(prepared.map(publish));
  const stepDir = path.join(rootDir, stepDirName(step));
  for (const kind of new Set(batches.map((b) => b.kind))) {
    // A step written in several calls keeps every call's files in its marker.
    const earlier = await markerFiles(path.join(stepDir, stepMarkerName(kind)));
    const files = written.filter((w, i) => batches[i]!.kind === kind).map((w) => path.basename(w.recordPath));
    const marker = StepMarkerSchema.parse({
      format: "gym-ckpt/rollout-step",
      version: 1,
      step,
      kind,
      files: [...new Set([...earlier, ...files])].sort(),
    });
    await writeFileAtomic(path.join(stepDir, stepMarkerName(kind)), Buffer.from(JSON.stringify(marker) + "\n"));
  }
  return written;
}

/**
 * Keeps record writing off the hot path: `enqueue` returns at once; steps are written one after
 * another in enqueue order (so steps appear on disk in order) and `flush` reports the first failure.
 */
export class RecordWriter {
  private tail: Promise<void> = Promise.resolve();
  private failure: unknown = undefined;

  constructor(private readonly rootDir: string) {}

  enqueue(step: number, batches: readonly EnvRecords[]): void {
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

async function exists(file: string): Promise<boolean> {
  return fs.access(file).then(
    () => true,
    () => false,
  );
}

/** The files an existing marker lists ([] when there is none or it is unreadable). */
async function markerFiles(file: string): Promise<string[]> {
  try {
    const parsed = StepMarkerSchema.safeParse(JSON.parse(await fs.readFile(file, "utf8")));
    return parsed.success ? parsed.data.files : [];
  } catch {
    return [];
  }
}
