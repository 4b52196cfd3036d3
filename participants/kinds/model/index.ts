/** The policy-model participant kind: tickets, held responses, generation cuts, capture ledger. */
export { ModelKind } from "./model-kind.js";
export type { ModelKindOptions, CallOutcome } from "./model-kind.js";
export type { AdmissionTicket } from "./admission-ticket.js";
export { continuationOf } from "./admission-ticket.js";
export { CaptureLedger } from "./capture-ledger.js";
export { StripedLocks } from "./striped-locks.js";
export { LedgerRowSchema, UsageSchema } from "./ledger-row.js";
export type { LedgerRow } from "./ledger-row.js";
export { MAX_MODEL_RECORD_ROWS, ModelRecordSchema } from "./model-record.js";
export type { ModelRecord } from "./model-record.js";
export { GENERATION_ROUTES, SKIP_CATEGORIES, isGenerationRoute, conversationDigest, constrainedReason, skipCategory } from "./conversation-digest.js";
export type { SkipCategory } from "./conversation-digest.js";
export { backendRoot, runCutRound, cutRecordOf } from "./generation-cut-round.js";
export type { CutBackend, CutRoundResult } from "./generation-cut-round.js";
export * from "./generation-cut-contract.js";
