import { z } from "zod";
import { CheckpointError } from "../../../protocol/index.js";
import { SessionCookieValueSchema } from "./session-cookie-value.js";
import type { AgentSessionHooks, RestoredAgentSession } from "../../kinds/agent/index.js";

/** What the reference agent keeps per session: the resources cookie its tool calls carry. */
export const SessionStateSchema = z.object({ cookie: SessionCookieValueSchema.nullable() }).strict();
export type SessionState = z.infer<typeof SessionStateSchema>;

/** The reference agent's session hooks: export the cookie, restore all or nothing, free on retire/close. */
export class AgentSessionState implements AgentSessionHooks {
  readonly sessions = new Map<string, SessionState>();

  set(key: string, state: SessionState): void {
    this.sessions.set(key, state);
  }

  get(key: string): SessionState | undefined {
    return this.sessions.get(key);
  }

  async exportAgentSessions(keys: string[]): Promise<Record<string, unknown>> {
    return Object.fromEntries(keys.map((key) => [key, this.sessions.get(key) ?? { cookie: null }]));
  }

  async restoreAgentSessions(restored: RestoredAgentSession[]): Promise<void> {
    const parsed = restored.map((r) => {
      const state = SessionStateSchema.safeParse(r.session);
      if (!state.success) throw new CheckpointError("invalid_checkpoint_state", `session ${r.session_key} holds no valid agent state`);
      return [r.session_key, state.data] as const;
    });
    for (const [key, state] of parsed) this.sessions.set(key, state);
  }

  async retireAgentSession(key: string): Promise<void> {
    this.sessions.delete(key);
  }
}
