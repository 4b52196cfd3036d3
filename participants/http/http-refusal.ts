import type { FastifyReply } from "fastify";
import { toCheckpointError } from "../../protocol/index.js";

/** Answers a data-plane refusal with its catalog status and the standard error body. */
export function sendRefusal(reply: FastifyReply, error: unknown): FastifyReply {
  const refusal = toCheckpointError(error);
  return reply.code(refusal.status).type("application/json").send(refusal.toReply());
}
