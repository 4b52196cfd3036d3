/** Reference verifiers: each a stateless + replay resources server that judges one request on its own. */
export { VerifierServer, parseVerifierBody } from "./verifier-server.js";
export type { VerifyResult } from "./verifier-server.js";
export { VerifierError, sendVerifierRefusal } from "./verifier-errors.js";
export type { VerifierErrorCode } from "./verifier-errors.js";
export { MathVerifier, extractAnswer, normalizeAnswer } from "./math-verifier.js";
export { CodeVerifier } from "./code-verifier.js";
export { extractCode, submittedCode } from "./code-block.js";
export { CompetitiveProgrammingVerifier, normalizeOutput } from "./competitive-programming-verifier.js";
export { EquivalenceJudgeVerifier, EQUIVALENCE_SYSTEM_PROMPT } from "./equivalence-judge-verifier.js";
export { CohortCompareVerifier, modelCohortJudge, COHORT_SYSTEM_PROMPT } from "./cohort-compare-verifier.js";
export { CohortTable, DEFAULT_COHORT_SETTINGS } from "./cohort-table.js";
export type { CohortJudge, CohortMember, CohortSettings, Coordinates } from "./cohort-table.js";
export { JudgeClient } from "./judge-client.js";
export type { JudgeClientOptions, ChatMessage } from "./judge-client.js";
export { runSandboxed, stopSandboxes, liveSandboxes, DEFAULT_SANDBOX_LIMITS } from "./sandbox/run-sandboxed.js";
export { SANDBOX_SLOTS } from "./sandbox/sandbox-slots.js";
export type { SandboxJob, SandboxLimits, SandboxOutcome, CaseResult } from "./sandbox/run-sandboxed.js";
