import type { FastifyReply } from "fastify";
import { CheckpointError } from "../../protocol/index.js";

/**
 * Verifier data-plane refusals that the checkpoint error catalog does not cover (a wire addition
 * of the verifiers; the body has the catalog's shape `{error:{code,detail}}`).
 */
export const VERIFIER_ERRORS = {
  invalid_coordinates: { status: 422, meaning: "The cohort coordinates (_ng_group_id, _ng_group_attempt, _ng_rollout_index) are invalid." },
  cohort_slot_conflict: { status: 409, meaning: "The member slot already holds a different payload (even after the cohort finished)." },
  cohort_superseded: { status: 409, meaning: "A newer _ng_group_attempt of the group exists; this attempt is retired." },
  cohort_failed: { status: 503, meaning: "The cohort did not collect every member before its collection timeout (or its evaluation timed out); retry the group as a new attempt." },
} as const;
export type VerifierErrorCode = keyof typeof VERIFIER_ERRORS;

export class VerifierError extends Error {
  constructor(
    readonly code: VerifierErrorCode,
    detail: string,
  ) {
    super(detail);
    this.name = "VerifierError";
  }

  get status(): number {
    return VERIFIER_ERRORS[this.code].status;
  }
}

/** Answers a VerifierError with its own status; anything else goes through the catalog. */
export function sendVerifierRefusal(reply: FastifyReply, error: unknown): FastifyReply | undefined {
  if (error instanceof VerifierError) return reply.code(error.status).type("application/json").send({ error: { code: error.code, detail: error.message } });
  if (error instanceof CheckpointError) return reply.code(error.status).type("application/json").send(error.toReply());
  return undefined;
}
