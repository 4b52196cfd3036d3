import { createHash } from "node:crypto";
import path from "node:path";
import { setImmediate as yieldToLoop } from "node:timers/promises";
import { writeFileAtomic } from "../storage/fs-durable.js";
import { describeIssues, invalidRequest } from "./errors.js";
import { encodeIndex, INDEX_FORMAT, INDEX_VERSION, type IndexRow } from "./rollout-index.js";
import { indexPathFor, recordFileName, stepDirName, type RecordKind } from "./record-paths.js";
import { StepMarkerSchema, stepMarkerName } from "./step-marker.js";
import { branchCount, traceReward, turnCount } from "./trace-graph.js";
import { TraceRecordSchema, type TraceRecord } from "./trace-record.js";

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

/** Serialisation yields to the event loop this often so a big step does not stall the caller. */
const YIELD_EVERY = 64;

/** Encodes records as JSON lines and returns each line's byte span (newline included). */
export async function encodeRecords(
  traces: readonly TraceRecord[],
): Promise<{ data: Buffer; spans: Array<{ offset: number; len: number }> }> {
  const chunks: Buffer[] = [];
  const spans: Array<{ offset: number; len: number }> = [];
  let offset = 0;
  for (let i = 0; i < traces.length; i++) {
    if (i > 0 && i % YIELD_EVERY === 0) await yieldToLoop();
    const line = Buffer.from(JSON.stringify(traces[i]) + "\n", "utf8"); // spans are bytes, never string length
    spans.push({ offset, len: line.length });
    chunks.push(line);
    offset += line.length;
  }
  return { data: Buffer.concat(chunks, offset), spans };
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

/** Validates and encodes one env's records; touches no file. */
async function prepare(rootDir: string, step: number, batch: EnvRecords): Promise<Prepared> {
  const stepDir = path.join(rootDir, stepDirName(step));
  const recordPath = path.join(stepDir, recordFileName(batch.kind, batch.env));
  const indexPath = indexPathFor(recordPath)!;
  const versions = batch.traces.map((trace, i) => {
    const v = typeof batch.policyVersion === "function" ? batch.policyVersion(trace, i) : (batch.policyVersion ?? null);
    if (v !== null && (!Number.isSafeInteger(v) || v < 0)) throw invalidRequest(`policy version must be a non-negative integer, got ${v}`);
    return v;
  });
  batch.traces.forEach((trace, i) => {
    const check = TraceRecordSchema.safeParse(trace);
    if (!check.success) throw invalidRequest(`trace ${i} of ${batch.env} is not a rollout record: ${describeIssues(check.error.issues)}`);
  });

  const { data, spans } = await encodeRecords(batch.traces);
  const rows: IndexRow[] = batch.traces.map((trace, i) => ({
    trace: trace.id,
    task_idx: trace.task.idx,
    task_name: trace.task.name,
    reward: traceReward(trace),
    policy_version: versions[i]!,
    step,
    branches: branchCount(trace),
    turns: turnCount(trace),
    stop: trace.stop_condition ?? null,
    offset: spans[i]!.offset,
    len: spans[i]!.len,
  }));
  const header = {
    format: INDEX_FORMAT,
    version: INDEX_VERSION,
    kind: batch.kind,
    env: batch.env,
    step,
    record_file: path.basename(recordPath),
    size: data.length,
    sha256: createHash("sha256").update(data).digest("hex"),
    records: rows.length,
  } as const;

  return { recordPath, indexPath, data, index: encodeIndex(header, rows), records: rows.length };
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
    const marker = StepMarkerSchema.parse({
      format: "gym-ckpt/rollout-step",
      version: 1,
      step,
      kind,
      files: written.filter((w, i) => batches[i]!.kind === kind).map((w) => path.basename(w.recordPath)),
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
