import { CONTROLLER_OPS, type ControllerOp } from "./controller-api.js";
import { ERROR_CODES, RESTORE_REFUSALS, type ErrorCode } from "./errors.js";

/**
 * The refusals each controller op can answer: the one table the OpenAPI document is generated from
 * and docs/api.md's "Refusals" lists are checked against (test/unit/coordinator/api-doc-refusals.test.ts),
 * so a controller author codes against what the op answers, not the whole catalog.
 */

/** Refusals any op can answer besides its own: the transport's, the token's, the leader gate's, the deadline's. */
export const EVERY_OP_REFUSALS = [
  "unauthorized",
  "invalid_request",
  "payload_too_large",
  "not_leader",
  "outcome_unknown",
  "deadline_exceeded",
  "internal_error",
  "reply_too_large",
] as const satisfies readonly ErrorCode[];

/** Answered by the NATS API alone: HTTP answers every reply in full. */
export const NATS_ONLY_REFUSALS: ReadonlySet<ErrorCode> = new Set<ErrorCode>(["reply_too_large"]);

/**
 * "The participants' codes" (docs/api.md): a failing participant's own refusal on its control
 * subject, or the one the coordinator gives for it (`unreachable`, `outcome_unknown`), answered as
 * the combined failure (`combinedFailure`).
 */
export const PARTICIPANT_REFUSALS = [
  "unauthorized",
  "invalid_request",
  "payload_too_large",
  "stale_checkpoint",
  "stale_epoch",
  "stale_incarnation",
  "checkpoint_conflict",
  "invalid_phase",
  "deadline_exceeded",
  "stale_attempt",
  "restart_in_scope",
  "invalid_checkpoint_state",
  "not_found",
  "storage_error",
  "unreachable",
  "outcome_unknown",
  "internal_error",
] as const satisfies readonly ErrorCode[];

/**
 * Which participants' refusals an op answers as its own: `combined`, any participant's
 * (PARTICIPANT_REFUSALS, "the participants' codes" or "commit failures" in docs/api.md); `restore`,
 * the refusal every participant gave a restore (RESTORE_REFUSALS, "a participant's refusal").
 */
export type ParticipantRefusals = "combined" | "restore";

export interface OpRefusals {
  /** The op's own codes, as its "Refusals" list in docs/api.md leads its bullets with them. */
  readonly codes: readonly ErrorCode[];
  readonly participants?: ParticipantRefusals;
}

export const CONTROLLER_OP_REFUSALS: Readonly<Record<ControllerOp, OpRefusals>> = {
  checkpoint: {
    codes: ["checkpoint_conflict", "prepare_incomplete", "unreachable", "storage_error", "invalid_request", "stale_checkpoint", "not_found", "restart_in_scope", "payload_too_large", "outcome_unknown", "journal_unavailable", "invalid_checkpoint_state"],
    participants: "combined",
  },
  prepare: { codes: ["checkpoint_conflict", "stale_checkpoint", "invalid_phase", "not_found", "storage_error", "payload_too_large", "unreachable", "journal_unavailable"] },
  commit: {
    codes: ["invalid_phase", "not_found", "stale_checkpoint", "checkpoint_conflict", "restart_in_scope", "invalid_request", "payload_too_large", "outcome_unknown", "storage_error"],
    participants: "combined",
  },
  publish: { codes: ["invalid_phase", "stale_checkpoint", "invalid_request", "not_found", "storage_error", "invalid_checkpoint_state", "checkpoint_conflict", "payload_too_large"] },
  resume: { codes: ["outcome_unknown", "not_found", "checkpoint_conflict", "restore_failed"], participants: "combined" },
  renew: { codes: ["not_found", "stale_checkpoint", "checkpoint_conflict"], participants: "combined" },
  restore: {
    codes: ["restore_failed", "not_found", "invalid_request", "unreachable", "invalid_phase", "invalid_checkpoint_state", "payload_too_large", "storage_error", "outcome_unknown"],
    participants: "restore",
  },
  retire: { codes: ["invalid_phase", "checkpoint_conflict", "not_found", "unreachable"], participants: "combined" },
  forget: { codes: ["invalid_phase", "checkpoint_conflict", "not_found", "unreachable"], participants: "combined" },
  status: { codes: [] },
  list: { codes: ["storage_error"] },
  get: { codes: ["not_found", "invalid_checkpoint_state", "storage_error"] },
};

/**
 * Every code `op` can answer over `api`: its own, its participants', and those every op can answer
 * (`deadline_exceeded` only where the request takes a `deadline_ts`: no other op waits for one).
 * Catalog order, for a stable document.
 */
export function controllerOpRefusals(op: ControllerOp, api: "nats" | "http"): ErrorCode[] {
  const { codes, participants } = CONTROLLER_OP_REFUSALS[op];
  const takesDeadline = "deadline_ts" in CONTROLLER_OPS[op].request.shape;
  const common = EVERY_OP_REFUSALS.filter((code) => code !== "deadline_exceeded" || takesDeadline);
  const ofParticipants = participants === "combined" ? PARTICIPANT_REFUSALS : participants === "restore" ? [...RESTORE_REFUSALS] : [];
  const all = new Set<ErrorCode>([...codes, ...ofParticipants, ...common]);
  if (api === "http") for (const code of NATS_ONLY_REFUSALS) all.delete(code);
  return ERROR_CODES.filter((code) => all.has(code));
}
