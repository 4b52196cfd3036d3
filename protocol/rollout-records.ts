import { constants } from "node:buffer";
import { createHash } from "node:crypto";
import { z } from "zod";
import { CheckpointError } from "./errors.js";
import { jsonNestsDeeperThan } from "./json-depth.js";
import { jsonTextWithin } from "./json-too-long.js";
import { inInputKeyOrder, JsonObjectSchema, keepingProtoKey } from "./json-value.js";

/**
 * Rollout records: the pure encoding shared by every writer (the replay record writer, the
 * collector) and every reader. One JSON line per finished rollout in
 * `rollouts/step_<N>/<kind>_rollouts_<env>.jsonl`, then a derived byte-span index
 * `index_<kind>_<env>.jsonl` beside it. Nothing here touches a file: callers own the I/O.
 */

// ---- record lines -------------------------------------------------------------------------

const TextPartSchema = z.object({ type: z.literal("text"), text: z.string() }).strict();
const ImagePartSchema = z
  .object({ type: z.literal("image_url"), image_url: z.object({ url: z.string() }).strict() })
  .strict();
export const TraceContentSchema = z.union([z.string(), z.array(z.union([TextPartSchema, ImagePartSchema]))]);

export const TraceToolCallSchema = z
  .object({ id: z.string(), name: z.string(), arguments: z.string() /* raw JSON text as emitted */ })
  .strict();

export const TraceMessageSchema = z.discriminatedUnion("role", [
  z.object({ role: z.literal("system"), content: TraceContentSchema }).strict(),
  z.object({ role: z.literal("user"), content: TraceContentSchema }).strict(),
  z
    .object({
      role: z.literal("assistant"),
      content: z.string().nullable().optional(),
      reasoning_content: z.string().nullable().optional(),
      tool_calls: z.array(TraceToolCallSchema).nullable().optional(),
      provider_state: z.unknown().optional(),
    })
    .strict(),
  z
    .object({
      role: z.literal("tool"),
      tool_call_id: z.string(),
      content: TraceContentSchema,
      name: z.string().nullable().optional(),
    })
    .strict(),
]);

export const TraceNodeSchema = z
  .object({
    parent: z.number().int().min(0).nullable(),
    message: TraceMessageSchema,
    /** True only when a model call of this rollout produced the message (seeded context is false). */
    sampled: z.boolean(),
    token_ids: z.array(z.number().int()),
    mask: z.array(z.boolean()),
    is_content: z.array(z.boolean()).optional(),
    logprobs: z.array(z.number()),
    finish_reason: z.string().nullable().optional(),
    usage: z.unknown().optional(),
  })
  .strict();

export const TracePromptSchema = z.union([z.string(), z.array(TraceMessageSchema)]);

/** `task` is open-ended: the source environment's own task schema validates its extra fields. */
export const TraceTaskSchema = keepingProtoKey(
  z.object({ idx: z.number().int(), name: z.string().nullable(), prompt: TracePromptSchema.nullable() }).catchall(z.unknown()),
);

/**
 * A record's named numbers (rewards, metrics) and its info, keys as written: zod builds a record by
 * assignment, so a key named `__proto__` vanished, and a reward so named read back as 0.
 */
const NumberMapSchema = keepingProtoKey(z.record(z.string(), z.number()));
const InfoSchema = keepingProtoKey(z.record(z.string(), z.unknown()));

/** Deepest nesting of a record's opaque fields: far past any real task or provider state, far short of a stack overflow. */
export const MAX_RECORD_NESTING = 1024;

export const TraceRecordSchema = z
  .object({
    id: z.string().min(1),
    task: TraceTaskSchema,
    nodes: z.array(TraceNodeSchema),
    rewards: NumberMapSchema,
    metrics: NumberMapSchema.optional(),
    info: InfoSchema.optional(),
    extra_usage: z.array(z.unknown()).optional(),
    is_completed: z.boolean().optional(),
    stop_condition: z.string().nullable().optional(),
    errors: z.array(z.unknown()).optional(),
    timing: z.unknown().optional(),
  })
  .strict()
  .superRefine((trace, ctx) => {
    // Parents must precede their children: graph walks rely on it and a cycle would never end.
    trace.nodes.forEach((node, i) => {
      if (node.parent !== null && node.parent >= i) {
        ctx.addIssue({ code: "custom", path: ["nodes", i, "parent"], message: "parent must be an earlier node" });
      }
    });
    // Readers refuse a malformed snapshot map, so a writer must too: one such record would fail
    // every later reload of a source that globs its file.
    const refs = traceSnapshotRefs(trace);
    if (typeof refs === "string") ctx.addIssue({ code: "custom", path: ["info", "snapshots"], message: refs });
    // The opaque fields nest as deep as their producer likes; a reader cloning or stringifying one
    // a few thousand levels deep would overflow the stack on every reload instead of refusing it.
    const opaque = [trace.task, trace.info, trace.extra_usage, trace.errors, trace.timing, ...trace.nodes.flatMap((n) => [n.usage, n.message.role === "assistant" ? n.message.provider_state : undefined])];
    if (opaque.some((value) => jsonNestsDeeperThan(value, MAX_RECORD_NESTING))) {
      ctx.addIssue({ code: "custom", path: [], message: `a field is nested more than ${MAX_RECORD_NESTING} levels deep` });
    }
  });

/**
 * `info.snapshots`: node index (decimal string) → opaque sandbox ref, as a map; or, when the map is
 * malformed (not an object, a key that is not an existing node, a ref that is not a string), why.
 */
export function traceSnapshotRefs(trace: { nodes: readonly unknown[]; info?: Record<string, unknown> | undefined }): Map<number, string> | string {
  const raw = trace.info?.["snapshots"];
  const refs = new Map<number, string>();
  if (raw === undefined || raw === null) return refs;
  if (typeof raw !== "object" || Array.isArray(raw)) return "info.snapshots must be an object";
  for (const [key, ref] of Object.entries(raw)) {
    if (!/^(0|[1-9][0-9]*)$/.test(key) || Number(key) >= trace.nodes.length || typeof ref !== "string") {
      return `info.snapshots has a bad entry ${JSON.stringify(key)} (it must name an existing node with a string ref)`;
    }
    refs.set(Number(key), ref);
  }
  return refs;
}

export type TraceContent = z.infer<typeof TraceContentSchema>;
export type TraceToolCall = z.infer<typeof TraceToolCallSchema>;
export type TraceMessage = z.infer<typeof TraceMessageSchema>;
export type TraceNode = z.infer<typeof TraceNodeSchema>;
export type TracePrompt = z.infer<typeof TracePromptSchema>;
export type TraceTask = z.infer<typeof TraceTaskSchema>;
export type TraceRecord = z.infer<typeof TraceRecordSchema>;

// ---- derived views (never stored in the record) ------------------------------------------

/** Leaves in node-index order: nodes no other node names as parent. */
export function traceLeaves(trace: TraceRecord): number[] {
  const hasChild = new Array<boolean>(trace.nodes.length).fill(false);
  for (const node of trace.nodes) if (node.parent !== null) hasChild[node.parent] = true;
  const out: number[] = [];
  hasChild.forEach((child, i) => {
    if (!child) out.push(i);
  });
  return out;
}

export function traceBranchCount(trace: TraceRecord): number {
  return traceLeaves(trace).length;
}

/** Turns are model calls: sampled nodes over the whole trace. */
export function traceTurnCount(trace: TraceRecord): number {
  return trace.nodes.reduce((n, node) => n + (node.sampled ? 1 : 0), 0);
}

/** The rollout reward is the sum of the weighted reward contributions. */
export function traceReward(trace: TraceRecord): number {
  let sum = 0;
  for (const value of Object.values(trace.rewards)) sum += value;
  return sum;
}

// ---- paths --------------------------------------------------------------------------------

export const ROLLOUTS_DIR = "rollouts";
export const RECORD_KINDS = ["train", "eval"] as const;
export type RecordKind = (typeof RECORD_KINDS)[number];
export const RecordKindSchema = z.enum(RECORD_KINDS);
export const ROLLOUT_ENV_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
const RECORD_FILE = /^(train|eval)_rollouts_([A-Za-z0-9][A-Za-z0-9._-]*)\.jsonl$/;

function invalid(detail: string): CheckpointError {
  return new CheckpointError("invalid_request", detail);
}

/** The longest env name a record file (and so its index) is written under. */
export const MAX_ROLLOUT_ENV_LENGTH = 200;

export function assertRolloutEnv(env: string): void {
  if (!ROLLOUT_ENV_PATTERN.test(env) || env.length > MAX_ROLLOUT_ENV_LENGTH) {
    throw invalid(`env name ${JSON.stringify(env)} must match ${ROLLOUT_ENV_PATTERN} and be at most ${MAX_ROLLOUT_ENV_LENGTH} characters`);
  }
}

export function assertRolloutStep(step: number): void {
  if (!Number.isSafeInteger(step) || step < 0) throw invalid(`step must be a non-negative integer, got ${step}`);
}

export function rolloutStepDir(step: number): string {
  assertRolloutStep(step);
  return `step_${step}`;
}

export function rolloutRecordFileName(kind: RecordKind, env: string): string {
  assertRolloutEnv(env);
  return `${kind}_rollouts_${env}.jsonl`;
}

/** The kind is in the index name so a train and an eval file of one env never share an index. */
export function rolloutIndexFileName(kind: RecordKind, env: string): string {
  assertRolloutEnv(env);
  return `index_${kind}_${env}.jsonl`;
}

/** kind and env of a conventional record file name, or null for any other name. */
export function parseRolloutRecordFileName(fileName: string): { kind: RecordKind; env: string } | null {
  const m = RECORD_FILE.exec(fileName);
  return m ? { kind: m[1] as RecordKind, env: m[2]! } : null;
}

/** POSIX paths relative to a rollouts root (`<run>/rollouts`): `step_<N>/<file>`. */
export function rolloutRecordPaths(step: number, kind: RecordKind, env: string): { stepDir: string; recordFile: string; indexFile: string } {
  const stepDir = rolloutStepDir(step);
  return { stepDir, recordFile: `${stepDir}/${rolloutRecordFileName(kind, env)}`, indexFile: `${stepDir}/${rolloutIndexFileName(kind, env)}` };
}

// ---- the index ----------------------------------------------------------------------------

export const ROLLOUT_INDEX_FORMAT = "gym-ckpt/rollout-index";
export const ROLLOUT_INDEX_VERSION = 1;

/** First index line: pins the record file (name, kind, env, size, sha256, record count). */
export const RolloutIndexHeaderSchema = z
  .object({
    format: z.literal(ROLLOUT_INDEX_FORMAT),
    version: z.literal(ROLLOUT_INDEX_VERSION),
    kind: z.enum(RECORD_KINDS),
    env: z.string().min(1),
    step: z.number().int().min(0).nullable(),
    record_file: z.string().min(1),
    size: z.number().int().min(0),
    sha256: z.string().regex(/^[0-9a-f]{64}$/),
    records: z.number().int().min(0),
  })
  .strict();

/** One index row per record, in file order. */
export const RolloutIndexRowSchema = z
  .object({
    trace: z.string().min(1),
    task_idx: z.number().int(),
    task_name: z.string().nullable(),
    reward: z.number(),
    policy_version: z.number().int().min(0).nullable(),
    step: z.number().int().min(0).nullable(),
    branches: z.number().int().min(0),
    turns: z.number().int().min(0),
    stop: z.string().nullable(),
    /** Byte offset of the record's line in the record file. */
    offset: z.number().int().min(0),
    /** Byte length of the line including its trailing newline. */
    len: z.number().int().min(1),
  })
  .strict();

export type RolloutIndexHeader = z.infer<typeof RolloutIndexHeaderSchema>;
export type RolloutIndexRow = z.infer<typeof RolloutIndexRowSchema>;

/**
 * The most bytes one batch's record file or its index may take: each is encoded into one Buffer, and
 * a longer one throws Node's bare RangeError (4 GiB on Node 20). Refused `invalid_request` before then.
 */
export const MAX_ROLLOUT_BATCH_BYTES = constants.MAX_LENGTH;

/** The `data` key of a batch refused for its size: how many of its leading records fit. */
const FITTING_RECORDS = "fitting_records";

function batchTooLarge(what: string, records: number, bytes: number, maxBytes: number, fitting: number): CheckpointError {
  return new CheckpointError(
    "invalid_request",
    `${what} of a batch of ${records} records would be ${bytes} bytes, over the ${maxBytes} one buffer can hold: split the batch (its first ${fitting} records fit)`,
    { data: { [FITTING_RECORDS]: fitting } },
  );
}

/**
 * How many leading records of a batch refused for its size (its record file or its index past
 * `MAX_ROLLOUT_BATCH_BYTES`) fit in the file it was refused for, for a caller that splits it there
 * (and again if that part's other file is refused); undefined for any other error.
 */
export function rolloutBatchFit(error: unknown): number | undefined {
  if (!(error instanceof CheckpointError) || error.code !== "invalid_request") return undefined;
  const fitting = error.data?.[FITTING_RECORDS];
  return typeof fitting === "number" ? fitting : undefined;
}

/**
 * The index's JSON lines, encoded line by line: joined into one string first, the index of a few
 * million records passed the longest string V8 makes (512 MiB) and threw a RangeError. Readers
 * ignore an index that long (they decode it as one string) and parse the record file in full. An
 * index longer than `maxBytes` (one Buffer's limit; smaller only in tests) is refused: rows are
 * longer than small records, so tens of millions of them can pass it before their record file does.
 */
export function encodeRolloutIndex(header: RolloutIndexHeader, rows: readonly RolloutIndexRow[], maxBytes: number = MAX_ROLLOUT_BATCH_BYTES): Buffer {
  const lines = [header, ...rows].map((line, position) => rolloutIndexLine(line, position));
  const lengths = lines.map((line) => Buffer.byteLength(line, "utf8"));
  const total = lengths.reduce((sum, length) => sum + length, 0);
  if (total > maxBytes) {
    // The header of fewer records is never longer (smaller size and count), so these rows fit with theirs.
    let fitting = 0;
    for (let used = lengths[0]!; fitting < rows.length && used + lengths[fitting + 1]! <= maxBytes; fitting++) used += lengths[fitting + 1]!;
    throw batchTooLarge("the index", rows.length, total, maxBytes, fitting);
  }
  const bytes = Buffer.allocUnsafe(total);
  let offset = 0;
  for (const line of lines) offset += bytes.write(line, offset, "utf8");
  return bytes;
}

/**
 * Index line `position` (0: the header, n: record n-1's row) with its newline. A row repeats its
 * record's id, task name and stop condition inside ~100 characters of keys and numbers of its own,
 * more than its record needs around them, so a record whose line fits MAX_RECORD_LINE_BYTES can
 * have a row longer than any string V8 makes (an id of MAX_STRING_LENGTH - 100 characters did):
 * refused as `invalid_request`, as a record whose own line is too long, instead of V8's RangeError
 * (which a collector would take for a failed flush and retry for ever).
 */
export function rolloutIndexLine(line: RolloutIndexHeader | RolloutIndexRow, position: number, maxLength: number = constants.MAX_STRING_LENGTH): string {
  const tooLong = () => {
    const longest = `longer than the longest string (${maxLength} characters)`;
    return invalid(position === 0 ? `the index header is ${longest}` : `record ${position - 1}'s index row is ${longest}: its id, task name or stop condition is too long`);
  };
  const json = jsonTextWithin(line, tooLong);
  if (json.length + 1 > maxLength) throw tooLong();
  return json + "\n";
}

/** The longest record line, newline included: the longest string Node decodes a buffer to. */
const MAX_RECORD_LINE_BYTES = constants.MAX_STRING_LENGTH;

/**
 * JSON lines with each line's byte span (newline included): spans are bytes, never string length.
 * A record JSON cannot encode (a BigInt or a cycle in a task's open-ended fields, a throwing
 * toJSON), or whose line would be longer than `maxLineBytes`, is `invalid_request`; so is a batch
 * whose lines together would be longer than `maxBatchBytes` (one Buffer's limit), naming the size
 * it would have and how many leading records fit. Both limits are smaller only in tests.
 */
export function encodeRecordLines(
  records: readonly unknown[],
  maxLineBytes: number = MAX_RECORD_LINE_BYTES,
  maxBatchBytes: number = MAX_ROLLOUT_BATCH_BYTES,
): { bytes: Buffer; spans: Array<{ offset: number; len: number }> } {
  const chunks: Buffer[] = [];
  const spans: Array<{ offset: number; len: number }> = [];
  let offset = 0;
  /** Records whose lines fit the batch, once one did not: the rest are only measured, for the refusal. */
  let fitting: number | undefined;
  for (const [i, record] of records.entries()) {
    let text: string | undefined;
    try {
      text = JSON.stringify(record);
    } catch (error) {
      throw invalid(`record ${i} cannot be encoded as JSON: ${error instanceof Error ? error.message : String(error)}`);
    }
    if (text === undefined) throw invalid(`record ${i} cannot be encoded as JSON`);
    // Readers decode a line as one string, whose limit Node applies to its UTF-8 bytes: a longer line
    // (multibyte text JSON still encodes) would make its file fail every later load. Checked with
    // the newline before the line is made: `text + "\n"` of a JSON exactly MAX_STRING_LENGTH long
    // would throw V8's RangeError instead.
    const length = Buffer.byteLength(text, "utf8") + 1;
    if (length > maxLineBytes) {
      throw invalid(`record ${i} is ${length} bytes as a JSON line, longer than any reader can decode (${maxLineBytes})`);
    }
    // Past one Buffer, Buffer.concat throws Node's bare RangeError (a collector would retry it at every
    // flush): the lines made so far are dropped and the rest measured, so the refusal names the size.
    if (fitting === undefined && offset + length > maxBatchBytes) {
      fitting = i;
      chunks.length = 0;
    }
    offset += length;
    if (fitting !== undefined) continue;
    const line = Buffer.allocUnsafe(length);
    line.write(text, 0, "utf8");
    line[length - 1] = 0x0a; // "\n"
    spans.push({ offset: offset - length, len: length });
    chunks.push(line);
  }
  if (fitting !== undefined) throw batchTooLarge("the record file", records.length, offset, maxBatchBytes, fitting);
  return { bytes: Buffer.concat(chunks, offset), spans };
}

// ---- step-complete marker -----------------------------------------------------------------

/** Written after every env file of one (step, kind) is published; lists those files. */
export const RolloutStepMarkerSchema = z
  .object({
    format: z.literal("gym-ckpt/rollout-step"),
    version: z.literal(1),
    step: z.number().int().min(0),
    kind: z.enum(RECORD_KINDS),
    files: z.array(z.string().min(1)),
  })
  .strict();
export type RolloutStepMarker = z.infer<typeof RolloutStepMarkerSchema>;

/** Every reader's limit on a step marker: it lists one step's file names, so thousands of envs fit. */
export const MAX_ROLLOUT_STEP_MARKER_BYTES = 1 << 20;

/**
 * Whether a step marker that lists `listed` (null: no marker) names every file of `files`, the
 * union of what it lists and the step's record files of its kind: by distinct names, since a
 * marker may list one twice (hand-edited, a foreign writer) and a count would miss a file.
 */
export function stepMarkerComplete(listed: readonly string[] | null, files: readonly string[]): boolean {
  return listed !== null && new Set(listed).size === files.length;
}

/**
 * The text of the step marker listing `files`. A marker larger than readers accept would be ignored
 * by every one of them (the step never completing for a follower that waits for it), so it is
 * refused here, `invalid_request`, before anything is written. `maxBytes` is for tests.
 */
export function encodeRolloutStepMarker(step: number, kind: RecordKind, files: readonly string[], maxBytes = MAX_ROLLOUT_STEP_MARKER_BYTES): string {
  const marker = RolloutStepMarkerSchema.parse({ format: "gym-ckpt/rollout-step", version: 1, step, kind, files });
  const text = `${JSON.stringify(marker)}\n`;
  const bytes = Buffer.byteLength(text, "utf8");
  if (bytes > maxBytes) {
    throw invalid(`the ${rolloutStepMarkerName(kind)} of step ${step} would list ${files.length} files in ${bytes} bytes, over the ${maxBytes} every reader accepts: write fewer envs into one step`);
  }
  return text;
}

export function rolloutStepMarkerName(kind: RecordKind): string {
  return `_complete_${kind}.json`;
}

/**
 * The record files a step marker completes, or null when `raw` is no marker of this step and kind:
 * one copied from another step names the same files, and one of the other kind says nothing of
 * these. Of what it lists, only its own kind's record files: it describes no others.
 */
export function rolloutStepMarkerFiles(raw: unknown, step: number, kind: RecordKind): string[] | null {
  const marker = RolloutStepMarkerSchema.safeParse(raw);
  if (!marker.success || marker.data.step !== step || marker.data.kind !== kind) return null;
  return marker.data.files.filter((name) => parseRolloutRecordFileName(name)?.kind === kind);
}

// ---- one env's file for one step ----------------------------------------------------------

export interface RolloutRecordBatch {
  kind: RecordKind;
  env: string;
  step: number;
  records: readonly unknown[];
  /** Policy version per record (the record itself does not carry it); one value for all, or per position. */
  policyVersion?: number | null | readonly (number | null)[];
}

export interface EncodedRolloutRecords {
  /** Relative to the rollouts root: `step_<N>/<kind>_rollouts_<env>.jsonl` and its index. */
  recordFile: string;
  indexFile: string;
  recordBytes: Buffer;
  indexBytes: Buffer;
  header: RolloutIndexHeader;
  rows: RolloutIndexRow[];
}

/**
 * The reward of record `i`: finite rewards can sum past the largest number, and JSON writes the
 * Infinity as null, an index row every reader rejects (so the whole file's index was ignored).
 */
function finiteReward(trace: TraceRecord, i: number, env: string): number {
  const reward = traceReward(trace);
  if (!Number.isFinite(reward)) throw invalid(`record ${i} of ${env}: its rewards sum to ${reward}, which no index row can carry`);
  return reward;
}

/**
 * Validates and encodes one env's records and their index. Pure: write `recordBytes` first and
 * `indexBytes` second (each atomically) so an index never points at bytes that are not there yet.
 * Refusals are `invalid_request` and name the first problem; a batch whose record file or index would
 * pass `maxBatchBytes` (one Buffer's limit; smaller only in tests) is one (see `rolloutBatchFit`).
 */
export function encodeRolloutRecords(batch: RolloutRecordBatch, maxBatchBytes: number = MAX_ROLLOUT_BATCH_BYTES): EncodedRolloutRecords {
  if (!RecordKindSchema.safeParse(batch.kind).success) throw invalid(`kind must be train or eval, got ${JSON.stringify(batch.kind)}`);
  const paths = rolloutRecordPaths(batch.step, batch.kind, batch.env);
  const pv = batch.policyVersion;
  if (Array.isArray(pv) && pv.length !== batch.records.length) throw invalid(`${pv.length} policy versions for ${batch.records.length} records`);
  const versions = batch.records.map((_, i) => {
    const v = Array.isArray(pv) ? (pv as (number | null)[])[i]! : ((pv as number | null | undefined) ?? null);
    if (v !== null && (!Number.isSafeInteger(v) || v < 0)) throw invalid(`policy version must be a non-negative integer, got ${v}`);
    return v;
  });
  const traces = batch.records.map((record, i) => {
    const parsed = TraceRecordSchema.safeParse(record);
    if (!parsed.success) {
      const issue = parsed.error.issues[0];
      throw invalid(`record ${i} of ${batch.env} is not a rollout record: ${issue ? `${issue.path.map(String).join(".") || "(root)"}: ${issue.message}` : "invalid"}`);
    }
    return parsed.data;
  });
  // What was validated is what gets written: zod reads through getters and inherited properties
  // that JSON.stringify skips, so a caller's object could pass with rewards its line lacked (a file
  // no reader could load again). In the caller's key order, so an ordinary record's bytes are its own JSON.
  const validated = traces.map((trace, i) => inInputKeyOrder(trace, batch.records[i]));
  const { bytes, spans } = encodeRecordLines(validated, MAX_RECORD_LINE_BYTES, maxBatchBytes);
  const rows: RolloutIndexRow[] = traces.map((trace, i) => ({
    trace: trace.id,
    task_idx: trace.task.idx,
    task_name: trace.task.name,
    reward: finiteReward(trace, i, batch.env),
    policy_version: versions[i]!,
    step: batch.step,
    branches: traceBranchCount(trace),
    turns: traceTurnCount(trace),
    stop: trace.stop_condition ?? null,
    offset: spans[i]!.offset,
    len: spans[i]!.len,
  }));
  const header: RolloutIndexHeader = {
    format: ROLLOUT_INDEX_FORMAT,
    version: ROLLOUT_INDEX_VERSION,
    kind: batch.kind,
    env: batch.env,
    step: batch.step,
    record_file: rolloutRecordFileName(batch.kind, batch.env),
    size: bytes.length,
    sha256: createHash("sha256").update(bytes).digest("hex"),
    records: rows.length,
  };
  return { recordFile: paths.recordFile, indexFile: paths.indexFile, recordBytes: bytes, indexBytes: encodeRolloutIndex(header, rows, maxBatchBytes), header, rows };
}

// ---- a finished /run's trajectory -----------------------------------------------------------

/**
 * What an environment server adds to its `/run` reply when asked (`x-ng-trajectory: 1`): the
 * episode as a record's message graph plus its outcome. A collector turns it into a record line.
 */
export const RunTrajectorySchema = z
  .object({
    /** The task's name in the record; a replayed task carries its seed name (`continue:…`). */
    task_name: z.string().nullable(),
    prompt: TracePromptSchema.nullable(),
    nodes: z.array(TraceNodeSchema),
    reward: z.number(),
    turns: z.number().int().min(0),
    stop_condition: z.string().nullable(),
    is_completed: z.boolean(),
    /** Lineage of a replayed task; its record then counts as replayed and is never mined again. A `__proto__` key is data. */
    replay: JsonObjectSchema.nullable(),
  })
  .strict();
export type RunTrajectory = z.infer<typeof RunTrajectorySchema>;

export const TRAJECTORY_HEADER = "x-ng-trajectory";

/** The record line of one finished row: the row's task plus the trajectory's graph and outcome. */
export function traceRecordFromTrajectory(input: {
  id: string;
  taskIdx: number;
  task: Record<string, unknown>;
  trajectory: RunTrajectory;
  info?: Record<string, unknown>;
}): TraceRecord {
  const t = input.trajectory;
  const record: TraceRecord = {
    id: input.id,
    task: { ...input.task, idx: input.taskIdx, name: t.task_name, prompt: t.prompt },
    nodes: t.nodes,
    rewards: { reward: t.reward },
    metrics: {},
    info: { ...input.info, ...(t.replay && { replay: t.replay }) },
    is_completed: t.is_completed,
    stop_condition: t.stop_condition,
    errors: [],
  };
  return TraceRecordSchema.parse(record);
}
