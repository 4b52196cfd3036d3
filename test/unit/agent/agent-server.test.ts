import { describe, expect, it } from "vitest";
import { canonicalDigest } from "../../../protocol/index.js";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { AgentSessionState } from "../../../participants/gym/agent-server/agent-session-state.js";
import { createAgentApp } from "../../../participants/gym/agent-server/agent-server.js";

describe("reference agent server", () => {
  it("legacy /run refuses a restored boundary that is not a legacy boundary with invalid_checkpoint_state, keeping the record", async () => {
    const state = new AgentSessionState();
    const kind = new AgentKind(state);
    const task = { expression: "1+1", tool_rounds: 1 };
    await kind.install([
      { episode_id: { rollout_id: "r1", attempt: 1 }, mode: "legacy", session_key: "r1", session: { task_digest: canonicalDigest(task) }, boundary: null, episode: { next: "bogus" } },
    ]);
    // Unreachable callees: a /run that started from seed would fail with another code.
    const app = createAgentApp({ kind, state, endpoints: { policyUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9", stream: false } });
    try {
      for (let i = 0; i < 2; i++) {
        const res = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 2, task } });
        expect(res.statusCode).toBe(422);
        expect(res.json()).toMatchObject({ error: { code: "invalid_checkpoint_state" } });
        expect(kind.legacy.pendingKeys()).toEqual(["r1-a2"]);
        expect(kind.legacy.steps.size).toBe(0);
      }
    } finally {
      await app.close();
    }
  });
});
