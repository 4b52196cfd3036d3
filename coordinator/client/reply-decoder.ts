import { CONTROLLER_OPS, CheckpointError, ErrorReplySchema, MAX_DEADLINE_AHEAD_S, describeZodError, foreignRefusal, type ControllerOp, type CtlReplyOf } from "../../protocol/index.js";

/** Turns a reply body into the op's typed reply, or throws the refusal as a CheckpointError. */
export function decodeControllerReply<O extends ControllerOp>(op: O, text: string): CtlReplyOf<O> {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    throw new CheckpointError("internal_error", `the coordinator's ${op} reply is not JSON`);
  }
  if (value !== null && typeof value === "object" && "error" in value) {
    const refusal = ErrorReplySchema.safeParse(value);
    if (refusal.success) throw CheckpointError.fromReply(refusal.data);
    const foreign = foreignRefusal(value, "the coordinator", op);
    if (foreign) throw foreign;
  }
  const parsed = CONTROLLER_OPS[op].reply.safeParse(value);
  if (!parsed.success) throw new CheckpointError("internal_error", `invalid ${op} reply: ${describeZodError(parsed.error)}`);
  return parsed.data as CtlReplyOf<O>;
}

/** Reply timeout of an op that takes no deadline (`publish`, `status`, `list`, `get`) unless the client sets one. */
export const DEFAULT_REPLY_TIMEOUT_MS = 90_000;
/** Slack past a deadline before a missing reply is `outcome_unknown`, unless the client sets one. */
export const DEFAULT_REPLY_SLACK_MS = 10_000;

/**
 * Time to wait for a reply: until the request's deadline plus slack. An op that takes a deadline but
 * was sent without one runs until the coordinator's `default_timeout_ms`, which the client does not
 * know; it waits as long as that can be (the setting is capped at the 7-day deadline cap) plus
 * slack, rather than report `outcome_unknown` for an op the coordinator is still running. A
 * `timeoutMs` the caller configured replaces both defaults.
 */
export function replyTimeoutMs(
  op: ControllerOp,
  request: unknown,
  options: { timeoutMs?: number | undefined; slackMs?: number | undefined },
  now = Date.now(),
): number {
  const slackMs = options.slackMs ?? DEFAULT_REPLY_SLACK_MS;
  if (hasDeadline(request)) return Math.max(request.deadline_ts * 1000 - now, 0) + slackMs;
  if (options.timeoutMs !== undefined) return options.timeoutMs;
  return "deadline_ts" in CONTROLLER_OPS[op].request.shape ? MAX_DEADLINE_AHEAD_S * 1000 + slackMs : DEFAULT_REPLY_TIMEOUT_MS;
}

/** The request carries its own absolute deadline. */
export function hasDeadline(request: unknown): request is { deadline_ts: number } {
  const deadline = (request as { deadline_ts?: unknown } | null)?.deadline_ts;
  return typeof deadline === "number" && Number.isFinite(deadline);
}

/**
 * The wait `replyTimeoutMs` gave is a default, not a bound the caller chose (no `deadline_ts`, no
 * `timeoutMs`): the coordinator's default timeout's cap, or 90 s for an op that takes no deadline.
 * The clients then also bound it by the coordinator's leadership (NATS: its lease; HTTP, past 90 s
 * only: its /readyz), so a coordinator that died mid-op does not leave them waiting for days, nor a
 * NATS `publish` for its full 90 s.
 */
export function defaultWait(request: unknown, options: { timeoutMs?: number | undefined }): boolean {
  return options.timeoutMs === undefined && !hasDeadline(request);
}
