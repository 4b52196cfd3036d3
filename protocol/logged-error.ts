import { CheckpointError, MAX_ERROR_DETAIL } from "./errors.js";

/** Past this many characters of JSON, an error's `data` is shortened for the log. */
const MAX_LOGGED_DATA_CHARS = 4096;
/** What a shortened `data` keeps of each array and string. */
const KEPT_ITEMS = 5;
const KEPT_STRING_CHARS = 300;

/**
 * An error as every pino logger writes it (`err`): pino's own serialization (`std`), bounded.
 * A catalog refusal other than internal_error is an outcome, not a defect: its message says what
 * and why, so it goes without its stack (a stack per retried refusal filled the log). Its message
 * is cut as its wire detail is, and a large `data` (every blocker of every participant of a
 * prepare_incomplete: 220 KB for 40 environments) keeps a few items of each list, so the one line
 * that says why a checkpoint failed is not cut or dropped by a log shipper.
 */
export function loggedError(err: unknown, std: (err: Error) => Record<string, unknown>): unknown {
  if (!(err instanceof Error)) return err;
  const logged = { ...std(err) };
  if (typeof logged["message"] === "string") logged["message"] = cut(logged["message"], MAX_ERROR_DETAIL);
  // An error made without a stack (an expected network failure logged by its code) has none to write, not "".
  if ((err instanceof CheckpointError && err.code !== "internal_error") || logged["stack"] === "") delete logged["stack"];
  if (logged["data"] !== undefined && jsonLength(logged["data"]) > MAX_LOGGED_DATA_CHARS) logged["data"] = shortened(logged["data"]);
  const cause = causeFields(err);
  if (cause) logged["cause"] = cause;
  return logged;
}

/** What of a system error's cause an operator greps for; its message is already in the error's (pino folds it in). */
const CAUSE_KEYS = ["code", "errno", "syscall", "path", "address", "port", "hostname"] as const;

/**
 * The first cause in the chain (at most 5 deep) that says which system call failed how (`code`:
 * EACCES of a storage_error, ECONNREFUSED of a fetch), else the direct cause: pino's serializer
 * folds a cause into the message and stack only, and a refusal's stack is not logged.
 */
function causeFields(err: Error): Record<string, unknown> | undefined {
  let first: Record<string, unknown> | undefined;
  let cause: unknown = err.cause;
  for (let depth = 0; depth < 5 && typeof cause === "object" && cause !== null; depth++) {
    const fields: Record<string, unknown> = { type: cause instanceof Error ? cause.constructor.name : "Object" };
    for (const key of CAUSE_KEYS) {
      const value = (cause as Record<string, unknown>)[key];
      if (typeof value === "string" || typeof value === "number") fields[key] = typeof value === "string" ? cut(value, KEPT_STRING_CHARS) : value;
    }
    if (fields["code"] !== undefined) return fields;
    first ??= fields;
    cause = (cause as { cause?: unknown }).cause;
  }
  return first && Object.keys(first).length > 1 ? first : undefined;
}

function cut(text: string, max: number): string {
  return text.length > max ? `${text.slice(0, max)}… (${text.length} characters)` : text;
}

function jsonLength(value: unknown): number {
  try {
    return JSON.stringify(value)?.length ?? 0;
  } catch {
    return Infinity;
  }
}

/** `value` with each array cut to its first items (and a note of how many were left out) and each string cut. */
function shortened(value: unknown, depth = 0): unknown {
  if (typeof value === "string") return cut(value, KEPT_STRING_CHARS);
  if (value === null || typeof value !== "object") return value;
  if (depth >= 4) return "…";
  if (Array.isArray(value)) {
    const kept = value.slice(0, KEPT_ITEMS).map((item) => shortened(item, depth + 1));
    return value.length > KEPT_ITEMS ? [...kept, `… ${value.length - KEPT_ITEMS} more`] : kept;
  }
  return Object.fromEntries(Object.entries(value).map(([key, item]) => [key, shortened(item, depth + 1)]));
}
