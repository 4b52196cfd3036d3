import { createHash } from "node:crypto";
import { CheckpointError } from "./errors.js";
import { MAX_JSON_DEPTH } from "./json-depth.js";
import { jsonTextWithin } from "./json-too-long.js";

/**
 * JSON with object keys sorted and no whitespace, so equal values always hash equally. A value
 * nested more than MAX_JSON_DEPTH levels deep (tasks, conversations and controller state come from
 * outside) is refused with `invalid_request` instead of overflowing the stack; one whose JSON is
 * longer than the longest string V8 makes (a huge generation body, which may grow when written
 * again: `9E20` is 21 digits) with `payload_too_large`, not V8's bare RangeError (`internal_error`).
 */
export function canonicalJson(value: unknown): string {
  return jsonTextWithin(sortKeys(value, 1), () => new CheckpointError("payload_too_large", "JSON value is longer than the longest string (about 512 MiB) once written canonically"));
}

function sortKeys(value: unknown, depth: number): unknown {
  if (value === null || typeof value !== "object") return value;
  if (depth > MAX_JSON_DEPTH) throw new CheckpointError("invalid_request", `JSON value nested more than ${MAX_JSON_DEPTH} levels deep`);
  if (Array.isArray(value)) return value.map((item) => sortKeys(item, depth + 1));
  // Null prototype: on a `{}`, assigning a parsed `__proto__` key would set the prototype and drop the key from the JSON.
  const out: Record<string, unknown> = Object.create(null);
  for (const key of Object.keys(value).sort()) {
    const v = (value as Record<string, unknown>)[key];
    if (v !== undefined) out[key] = sortKeys(v, depth + 1);
  }
  return out;
}

export function sha256Hex(data: string | Uint8Array): string {
  return createHash("sha256").update(data).digest("hex");
}

/** sha256 of the canonical JSON of a value: task digests, inventory digests. */
export function canonicalDigest(value: unknown): string {
  return sha256Hex(canonicalJson(value));
}
