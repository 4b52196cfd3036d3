import type { EpisodeId } from "../../../protocol/index.js";

export interface RestoredAgentSession {
  session_key: string;
  /** The NEXT attempt the session is bound to. */
  episode_id: EpisodeId;
  session: unknown;
}

/**
 * The agent server's own session state. Export runs at commit while every session is parked; it
 * must return what a restore needs to rebuild the state as of the checkpoint. Restore runs in a
 * fresh process: validate everything, then install all or nothing.
 */
export interface AgentSessionHooks {
  /** Must return a value for every key, or the commit fails. */
  exportAgentSessions(keys: string[]): Promise<Record<string, unknown>>;
  restoreAgentSessions(sessions: RestoredAgentSession[]): Promise<void>;
  /** Frees one session's state (retire, close, scope clean-up, or a failed restore: tolerate a key it never installed). */
  retireAgentSession(key: string): Promise<void>;
}

/** Hooks for agents that keep nothing of their own per session. */
export const noSessionHooks: AgentSessionHooks = {
  async exportAgentSessions(keys) {
    return Object.fromEntries(keys.map((key) => [key, null]));
  },
  async restoreAgentSessions() {},
  async retireAgentSession() {},
};
