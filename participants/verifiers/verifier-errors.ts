import type { FastifyReply } from "fastify";
import { CheckpointError, type ErrorCode } from "../../protocol/index.js";
import { sendRefusal } from "../http/http-refusal.js";

/** The cohort verifier's refusals; their codes live in the error catalog like every other. */
export type VerifierErrorCode = Extract<ErrorCode, "invalid_coordinates" | "cohort_slot_conflict" | "cohort_task_conflict" | "cohort_superseded" | "cohort_failed" | "cohort_capacity" | "sandbox_capacity">;

export class VerifierError extends CheckpointError {
  constructor(code: VerifierErrorCode, detail: string) {
    super(code, detail);
  }
}

/** Answers catalog refusals (verifiers are resources servers); anything else is left to fastify's error handler. */
export function sendVerifierRefusal(reply: FastifyReply, error: unknown): FastifyReply | undefined {
  return error instanceof CheckpointError ? sendRefusal(reply, error, "resources") : undefined;
}
