import type { JsonValue } from "./json-value.js";

/**
 * What an `exported` server implements so its sessions survive a crash. Every hook receives
 * session ids (the `ng_session` cookie values); the SDK owns the binding to episodes.
 */
export interface ResourcesSessionHooks {
  /**
   * The state of each session, as JSON. A session the server no longer has (it already dropped
   * it) is simply left out: it is skipped with a warning and does not fail the commit.
   */
  exportSessionStates(sessionIds: string[]): Promise<Record<string, JsonValue>>;
  /** Validate every state first, then install all of them, or throw and install nothing. */
  restoreSessionStates(states: Record<string, JsonValue>): Promise<void>;
  /**
   * Free one session's state; must tolerate a session that is already gone. Also called once a
   * request ended the session (a 2xx `/verify`, `/close_session` or `sessions.ended`).
   */
  retireSessionState(sessionId: string): Promise<void>;
  /** Optional, best effort: after a `stop` commit, free the compute of the sessions it exported (no others). */
  parkSessionStates?(sessionIds: string[]): Promise<void>;
}
