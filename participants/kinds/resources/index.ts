/** Resources participant SDK: declarations, the session-aware middleware and the kind adapter. */
export {
  CheckpointModeSchema,
  CheckpointVerifySchema,
  HEADER_CHECKPOINT_VERIFY,
  HEADER_CHECKPOINT_RESTART,
  SESSION_COOKIE,
  ROUTE_SEED,
  ROUTE_VERIFY,
  ROUTE_CLOSE,
} from "./resources-modes.js";
export type { CheckpointMode, CheckpointVerify } from "./resources-modes.js";
export { ResourcesSessionRecordSchema, SessionIdSchema } from "./resources-session-record.js";
export type { ResourcesSessionRecord } from "./resources-session-record.js";
export type { ResourcesSessionHooks } from "./resources-session-hooks.js";
export type { JsonValue } from "./json-value.js";
export { AdmissionGate } from "./admission-gate.js";
export { ResourcesKind, ownerRefusal, REPLAYABLE_END_HOLD_MS, UNUSED_SEED_LIFETIME_MS } from "./resources-kind.js";
export type { ResourcesKindOptions, RequestRole, RequestTicket } from "./resources-kind.js";
export { installResourcesCheckpointing } from "./resources-middleware.js";
export type { SessionAccess } from "./resources-middleware.js";
export { ResourcesServer, createResourcesApp, declarationsOf } from "./resources-server.js";
export type { ResourcesApp, ResourcesAppOptions } from "./resources-server.js";
export { newSessionId, readSessionCookie, sessionCookieHeader } from "./session-cookie.js";
