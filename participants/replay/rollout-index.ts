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
 * The index's lines that are not blank, decoded one at a time: the index can be 512 MiB, and split
 * whole (every line a string, every one parsed) a garbage one cost some 24 times its size in heap
 * before its first line was even checked. A newline byte is never inside a UTF-8 sequence, so each
 * line decodes as it did from the whole text.
 */
function* indexLines(index: Buffer): Generator<string> {
  for (let start = 0; start < index.length; ) {
    let end = index.indexOf(0x0a, start);
    if (end === -1) end = index.length;
    const line = index.toString("utf8", start, end);
    start = end + 1;
    if (line.trim() !== "") yield line;
  }
}

function parsedLine(line: string): { ok: true; value: unknown } | { ok: false } {
  try {
    return { ok: true, value: JSON.parse(line) as unknown };
  } catch {
    return { ok: false };
  }
}

/**
 * Validates an index (its bytes) against its record file without reading the record file.
 * Rows must tile the file exactly: first offset 0, each row starting where the previous ended,
 * the last ending at the file size. That rejects offsets past the end, overlapping or gapped
 * spans and stale rows before a single span is read. The header is checked first and the rows one
 * at a time, so a rejected index stops at its first bad line (a row past the header's count too).
 */
export function checkIndex(index: Buffer, expect: IndexExpectation): IndexCheck {
  const lines = indexLines(index);
  const first = lines.next();
  if (first.done) return { ok: false, reason: "empty index" };
  const headerLine = parsedLine(first.value);
  if (!headerLine.ok) return { ok: false, reason: "index is not JSON lines" };
  const header = IndexHeaderSchema.safeParse(headerLine.value);
  if (!header.success) return { ok: false, reason: `bad header: ${describeIssues(header.error.issues)}` };
  const h = header.data;
  if (h.record_file !== expect.recordFile) return { ok: false, reason: `index names ${h.record_file}` };
  if (h.kind !== expect.kind || h.env !== expect.env) return { ok: false, reason: "index kind/env differ from the file name" };
  // Same name, kind and env as the file's own index: only the step tells an index copied from another step.
  if (h.step !== expect.step) return { ok: false, reason: `index is for step ${h.step}, the record file is in step ${expect.step}` };
  if (h.size !== expect.size) return { ok: false, reason: `size ${h.size} != record file size ${expect.size}` };

  const rows: IndexRow[] = [];
  let end = 0;
  for (const line of lines) {
    const i = rows.length + 1;
    if (i > h.records) return { ok: false, reason: "row count differs from header" };
    const parsed = parsedLine(line);
    if (!parsed.ok) return { ok: false, reason: "index is not JSON lines" };
    const row = IndexRowSchema.safeParse(parsed.value);
    if (!row.success) return { ok: false, reason: `bad row ${i}: ${describeIssues(row.error.issues)}` };
    if (row.data.offset !== end) return { ok: false, reason: `row ${i} span does not follow the previous one` };
    end = row.data.offset + row.data.len;
    if (end > expect.size) return { ok: false, reason: `row ${i} span ends past the end of the file` };
    rows.push(row.data);
  }
  if (rows.length !== h.records) return { ok: false, reason: "row count differs from header" };
  if (end !== expect.size) return { ok: false, reason: "rows do not cover the record file" };
  return { ok: true, header: h, rows };
}
