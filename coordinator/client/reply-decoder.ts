import { CONTROLLER_OPS, CheckpointError, ErrorReplySchema, describeZodError, type ControllerOp, type CtlReplyOf } from "../../protocol/index.js";

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
  }
  const parsed = CONTROLLER_OPS[op].reply.safeParse(value);
  if (!parsed.success) throw new CheckpointError("internal_error", `invalid ${op} reply: ${describeZodError(parsed.error)}`);
  return parsed.data as CtlReplyOf<O>;
}

/** Time to wait for a reply: until the request's deadline plus slack, or the default. */
export function replyTimeoutMs(request: unknown, defaultMs: number, slackMs: number, now = Date.now()): number {
  const deadline = (request as { deadline_ts?: unknown } | null)?.deadline_ts;
  if (typeof deadline === "number" && Number.isFinite(deadline)) return Math.max(deadline * 1000 - now, 0) + slackMs;
  return defaultMs;
}
