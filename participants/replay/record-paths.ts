import path from "node:path";
import {
  CheckpointError,
  RECORD_KINDS,
  assertRolloutEnv,
  ROLLOUT_ENV_PATTERN,
  MAX_ROLLOUT_ENV_LENGTH,
  parseRolloutRecordFileName,
  rolloutIndexFileName,
  rolloutRecordFileName,
  type RecordKind,
} from "../../protocol/index.js";
import { invalidRequest } from "./errors.js";

/**
 * Layout: <root>/step_<N>/<kind>_rollouts_<env>.jsonl with its index beside it as
 * index_<kind>_<env>.jsonl. The kind is part of the index name so a train and an eval file
 * of the same env in the same step can never share (and misread) one index.
 */

// Names are the protocol's (protocol/rollout-records.ts); replay refuses with its own error type.
export { RECORD_KINDS, type RecordKind };
export const ENV_NAME_PATTERN = ROLLOUT_ENV_PATTERN;
const INDEX_FILE = /^index_(train|eval)_[A-Za-z0-9][A-Za-z0-9._-]*\.jsonl$/;
const STEP_DIR = /^step_(0|[1-9][0-9]*)$/;

export function assertEnvName(env: string): void {
  try {
    assertRolloutEnv(env);
  } catch (error) {
    if (error instanceof CheckpointError) throw invalidRequest(error.message, { cause: error });
    throw error;
  }
}

export function stepDirName(step: number): string {
  if (!Number.isSafeInteger(step) || step < 0) throw invalidRequest(`step must be a non-negative integer, got ${step}`);
  return `step_${step}`;
}

export function recordFileName(kind: RecordKind, env: string): string {
  assertEnvName(env);
  return rolloutRecordFileName(kind, env);
}

/** kind and env of a conventional record file name, or null for any other name. */
export function parseRecordFileName(fileName: string): { kind: RecordKind; env: string } | null {
  return parseRolloutRecordFileName(fileName);
}

/**
 * The index that may sit beside a record file; null when the name is not conventional, or its env is
 * longer than any writer names an index after (always fully parsed, not refused: the file is still records).
 */
export function indexPathFor(recordPath: string): string | null {
  const parsed = parseRecordFileName(path.basename(recordPath));
  if (!parsed || parsed.env.length > MAX_ROLLOUT_ENV_LENGTH) return null;
  return path.join(path.dirname(recordPath), rolloutIndexFileName(parsed.kind, parsed.env));
}

/** Index files are never records, even when a broad glob happens to match them. */
export function isIndexFileName(fileName: string): boolean {
  return INDEX_FILE.test(fileName);
}

/** The step of a record file from its step_<N> directory, or null. */
export function stepOfPath(recordPath: string): number | null {
  const m = STEP_DIR.exec(path.basename(path.dirname(recordPath)));
  return m ? Number(m[1]) : null;
}
