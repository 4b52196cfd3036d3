/**
 * Replay refusals. Codes line up with the project's error catalog:
 *  - invalid_request: bad config or caller input;
 *  - invalid_checkpoint_state: corrupt or hostile files on disk.
 * `reason` is a stable machine-readable sub-code (e.g. "index_mismatch") where callers branch on it.
 */
export type ReplayErrorCode = "invalid_request" | "invalid_checkpoint_state";

export class ReplayError extends Error {
  readonly code: ReplayErrorCode;
  readonly reason: string | undefined;

  constructor(code: ReplayErrorCode, message: string, options: { cause?: unknown; reason?: string } = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = "ReplayError";
    this.code = code;
    this.reason = options.reason;
  }
}

export function invalidRequest(message: string, options?: { cause?: unknown; reason?: string }): ReplayError {
  return new ReplayError("invalid_request", message, options);
}

export function invalidState(message: string, options?: { cause?: unknown; reason?: string }): ReplayError {
  return new ReplayError("invalid_checkpoint_state", message, options);
}

/** One-line summary of a zod failure for error messages. */
export function describeIssues(issues: ReadonlyArray<{ path: PropertyKey[]; message: string }>): string {
  return issues
    .slice(0, 3)
    .map((i) => `${i.path.length ? i.path.map(String).join(".") : "(root)"}: ${i.message}`)
    .join("; ");
}
