/** Agent participant SDK: sessions parked at boundaries, legacy `/run` episodes, the kind adapter. */
export { AgentSessions } from "./agent-sessions.js";
export type { ActivateOptions, Activation, SessionState, ExportedSession } from "./agent-sessions.js";
export { AgentRecordSchema, LegacySessionSchema } from "./agent-record.js";
export type { AgentRecord } from "./agent-record.js";
export { noSessionHooks } from "./agent-session-hooks.js";
export type { AgentSessionHooks, RestoredAgentSession } from "./agent-session-hooks.js";
export { AgentKind } from "./agent-kind.js";
