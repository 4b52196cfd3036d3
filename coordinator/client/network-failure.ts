import { neverSentCode } from "./never-sent.js";

/** A connection reset, dropped or timed out: what a Gym server crashing or restarting mid-request looks like. */
const NETWORK_CODES = new Set(["ECONNRESET", "EPIPE", "ETIMEDOUT", "UND_ERR_SOCKET", "UND_ERR_CLOSED", "UND_ERR_HEADERS_TIMEOUT", "UND_ERR_BODY_TIMEOUT"]);

/**
 * The code of an expected network failure of an HTTP request (a connection refused, reset or
 * dropped; a timeout, ours included), or undefined for anything else. Such a failure is an outcome
 * whose stack (the HTTP client's internals) tells an operator nothing: it is logged by its code.
 */
export function networkFailureCode(error: unknown): string | undefined {
  if (error instanceof Error && error.name === "TimeoutError") return "TimeoutError";
  const never = neverSentCode(error);
  if (never !== undefined) return never;
  const code = ((error as { cause?: { code?: unknown } } | null)?.cause)?.code ?? (error as { code?: unknown } | null)?.code;
  return typeof code === "string" && NETWORK_CODES.has(code) ? code : undefined;
}

/**
 * A network failure as a log line's `err`: its message (with its cause's) and code, without a stack
 * (an Error, so any pino error serializer writes it alike: `type` NetworkFailure, no `stack`).
 */
export class NetworkFailure extends Error {
  readonly code: string;

  constructor(error: unknown, code: string) {
    const err = error as { message?: unknown; cause?: { message?: unknown } };
    const cause = typeof err.cause?.message === "string" && err.cause.message !== err.message ? `: ${err.cause.message}` : "";
    super(`${String(err.message)}${cause}`);
    this.name = "NetworkFailure";
    this.code = code;
    // Not in the log: the HTTP client's internals.
    Object.defineProperty(this, "stack", { value: undefined, enumerable: false });
  }
}
