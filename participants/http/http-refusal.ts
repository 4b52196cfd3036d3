import type { FastifyReply } from "fastify";
import type { Logger } from "pino";
import { toCheckpointError, type Kind } from "../../protocol/index.js";
import { countRefusal } from "../telemetry/instruments.js";

/**
 * Answers a data-plane refusal with its catalog status and the standard error body, and counts it
 * in `gym_ckpt.refusals` under the participant kind that answers (null: the server is no
 * participant, like the reference policy backend, and counts nothing). With `logger`, an
 * internal_error is logged too.
 */
export function sendRefusal(reply: FastifyReply, error: unknown, kind: Kind | null, logger?: Logger): FastifyReply {
  const refusal = toCheckpointError(error);
  if (kind !== null) countRefusal(error, kind);
  // internal_error is ours, and the catalog sends its reader to the logs: they keep it, with its stack.
  // Any other code is the caller's or a callee's, answered on the wire alone.
  if (refusal.code === "internal_error") logger?.error({ err: error, method: reply.request.method, url: reply.request.url }, "request failed with internal_error");
  return reply.code(refusal.status).type("application/json").send(refusal.toReply());
}

/** `sendRefusal`'s counting, for refusals answered outside a reply (on the raw socket, an Expect): null counts nothing. */
export function refusalCounter(kind: Kind | null): (refusal: unknown) => void {
  return (refusal) => {
    if (kind !== null) countRefusal(refusal, kind);
  };
}
