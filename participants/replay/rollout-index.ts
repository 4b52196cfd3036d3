import {
  RolloutIndexHeaderSchema as IndexHeaderSchema,
  RolloutIndexRowSchema as IndexRowSchema,
  type RolloutIndexHeader as IndexHeader,
  type RolloutIndexRow as IndexRow,
} from "../../protocol/index.js";
import { describeIssues } from "./errors.js";

/**
 * The index beside a record file: a header line that pins the record file (name, kind, env,
 * size, sha256, record count), then one row per record in file order with its byte span.
 * The index is derived and optional: a reader that finds it missing, stale or hostile
 * ignores it and parses the record file in full.
 */

// The wire shapes live in the protocol so every writer encodes the same index.
export {
  ROLLOUT_INDEX_FORMAT as INDEX_FORMAT,
  ROLLOUT_INDEX_VERSION as INDEX_VERSION,
  RolloutIndexHeaderSchema as IndexHeaderSchema,
  RolloutIndexRowSchema as IndexRowSchema,
  encodeRolloutIndex as encodeIndex,
} from "../../protocol/index.js";
export type { RolloutIndexHeader as IndexHeader, RolloutIndexRow as IndexRow } from "../../protocol/index.js";

/** What the record file actually is, measured by the reader (size from fstat of the open handle). */
export interface IndexExpectation {
  recordFile: string;
  kind: string;
  env: string;
  /** The step of the record file's step_<N> directory, null outside one (stepOfPath). */
  step: number | null;
  size: number;
}

export type IndexCheck = { ok: true; header: IndexHeader; rows: IndexRow[] } | { ok: false; reason: string };

/**
 * Validates an index against its record file without reading the record file.
 * Rows must tile the file exactly: first offset 0, each row starting where the previous ended,
 * the last ending at the file size. That rejects offsets past the end, overlapping or gapped
 * spans and stale rows before a single span is read.
 */
export function checkIndex(text: string, expect: IndexExpectation): IndexCheck {
  const lines = text.split("\n").filter((line) => line.trim() !== "");
  if (lines.length === 0) return { ok: false, reason: "empty index" };
  let parsedLines: unknown[];
  try {
    parsedLines = lines.map((line) => JSON.parse(line) as unknown);
  } catch {
    return { ok: false, reason: "index is not JSON lines" };
  }
  const header = IndexHeaderSchema.safeParse(parsedLines[0]);
  if (!header.success) return { ok: false, reason: `bad header: ${describeIssues(header.error.issues)}` };
  const h = header.data;
  if (h.record_file !== expect.recordFile) return { ok: false, reason: `index names ${h.record_file}` };
  if (h.kind !== expect.kind || h.env !== expect.env) return { ok: false, reason: "index kind/env differ from the file name" };
  // Same name, kind and env as the file's own index: only the step tells an index copied from another step.
  if (h.step !== expect.step) return { ok: false, reason: `index is for step ${h.step}, the record file is in step ${expect.step}` };
  if (h.size !== expect.size) return { ok: false, reason: `size ${h.size} != record file size ${expect.size}` };
  if (h.records !== parsedLines.length - 1) return { ok: false, reason: "row count differs from header" };

  const rows: IndexRow[] = [];
  let end = 0;
  for (let i = 1; i < parsedLines.length; i++) {
    const row = IndexRowSchema.safeParse(parsedLines[i]);
    if (!row.success) return { ok: false, reason: `bad row ${i}: ${describeIssues(row.error.issues)}` };
    if (row.data.offset !== end) return { ok: false, reason: `row ${i} span does not follow the previous one` };
    end = row.data.offset + row.data.len;
    if (end > expect.size) return { ok: false, reason: `row ${i} span ends past the end of the file` };
    rows.push(row.data);
  }
  if (end !== expect.size) return { ok: false, reason: "rows do not cover the record file" };
  return { ok: true, header: h, rows };
}
