import { isUtf8 } from "node:buffer";
import type { z } from "zod";
import { CheckpointError, describeZodError } from "./errors.js";
import { duplicateJsonKey } from "./json-duplicate-keys.js";
import { unsafeJsonInteger } from "./json-unsafe-integer.js";
import { MAX_CONTROL_MESSAGE_BYTES } from "./version.js";

/**
 * Parses and validates one message. Oversized payloads, malformed JSON and schema violations all
 * become catalog errors, so a receiver can answer them without touching its state.
 */
export function decodeMessage<S extends z.ZodType>(schema: S, data: Uint8Array | string): z.infer<S> {
  return validated(schema, parsedJson(messageText(data)));
}

/**
 * decodeMessage for a request its receiver acts on (the controller APIs, a participant's control
 * subjects): JSON.parse would also read, without a word, a key named twice in one object (keeping
 * the last) and an integer a double cannot hold exactly (rounding it), so both are refused
 * `invalid_request` naming the key or the literal. Two linear scans of the text: a few µs for a
 * message of a few hundred bytes, about what JSON.parse takes.
 */
export function decodeRequest<S extends z.ZodType>(schema: S, data: Uint8Array | string): z.infer<S> {
  const text = messageText(data);
  const value = parsedJson(text);
  // Valid JSON by now, so the scans can trust its structure. Before the schema, so a rounded
  // integer is named as sent rather than by zod's "too big" about its rounding.
  const twice = duplicateJsonKey(text);
  if (twice !== undefined) throw new CheckpointError("invalid_request", `key ${JSON.stringify(twice)} appears twice in one object; JSON.parse would keep only the last`);
  const unsafe = unsafeJsonInteger(text);
  if (unsafe !== undefined) throw new CheckpointError("invalid_request", `integer ${unsafe} is past what a double holds exactly: it would be stored as ${Number(unsafe)}; send it as a string`);
  return validated(schema, value);
}

function messageText(data: Uint8Array | string): string {
  const size = typeof data === "string" ? Buffer.byteLength(data) : data.byteLength;
  if (size > MAX_CONTROL_MESSAGE_BYTES) {
    throw new CheckpointError("payload_too_large", `message is ${size} bytes; the limit is ${MAX_CONTROL_MESSAGE_BYTES}`);
  }
  if (typeof data === "string") return data;
  // Refused, not decoded leniently: a stray byte read as U+FFFD would be stored changed (an inline
  // controller state, an id), as a config file's would (config-loader).
  if (!isUtf8(data)) throw new CheckpointError("invalid_request", "message is not valid UTF-8");
  return Buffer.from(data.buffer, data.byteOffset, data.byteLength).toString("utf8");
}

function parsedJson(text: string): unknown {
  try {
    return JSON.parse(text);
  } catch (error) {
    throw new CheckpointError("invalid_request", `malformed JSON: ${(error as Error).message}`);
  }
}

function validated<S extends z.ZodType>(schema: S, value: unknown): z.infer<S> {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new CheckpointError("invalid_request", describeZodError(parsed.error));
  return parsed.data;
}

/**
 * A name given in code or configuration (a participant's deployment or instance) checked against
 * its schema, refused `invalid_request` naming it as a message's field would be: such names become
 * NATS subject tokens and directory names, so a `*` or `..` must never get that far.
 */
export function parseName<S extends z.ZodType>(schema: S, value: unknown, what: string): z.infer<S> {
  const parsed = schema.safeParse(value);
  if (!parsed.success) throw new CheckpointError("invalid_request", `${what}: ${describeZodError(parsed.error)}`);
  return parsed.data;
}

/**
 * Serializes a reply to an operation that already ran: too large is `reply_too_large` (the
 * operation succeeded), not `payload_too_large` (which promises nothing changed).
 */
export function encodeReply(value: unknown, op: string): string {
  try {
    return encodeMessage(value);
  } catch (error) {
    if (!(error instanceof CheckpointError) || error.code !== "payload_too_large") throw error;
    throw new CheckpointError("reply_too_large", `${op} succeeded, but its reply does not fit one NATS message: ${error.message}`);
  }
}

/** Serializes a message, refusing anything that would not fit in one NATS message. */
export function encodeMessage(value: unknown): string {
  const text = JSON.stringify(value);
  const size = Buffer.byteLength(text);
  if (size > MAX_CONTROL_MESSAGE_BYTES) {
    throw new CheckpointError("payload_too_large", `message is ${size} bytes; the limit is ${MAX_CONTROL_MESSAGE_BYTES}`);
  }
  return text;
}
