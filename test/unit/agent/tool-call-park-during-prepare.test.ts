import { afterEach, describe, expect, it, vi } from "vitest";
import { waitUntil } from "../../support/wait-until.js";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { AgentSessionState } from "../../../participants/gym/agent-server/agent-session-state.js";
import { createAgentApp } from "../../../participants/gym/agent-server/agent-server.js";
import { calculatorPolicyMessage } from "./calculator-policy.js";

afterEach(() => vi.unstubAllGlobals());

const json = (body: unknown, status = 200, headers: Record<string, string> = {}) => new Response(JSON.stringify(body), { status, headers });

/**
 * A stubbed policy (a tool call, then "42") and calculator whose first call is refused
 * `admission_closed` (a restored session still being freed) just as the agent's own prepare closes
 * its admission; the next call is served.
 */
function stubGym(agent: AgentKind) {
  const calls = { policy: 0, calculator: 0 };
  vi.stubGlobal("fetch", async (url: string, init: { body?: string }) => {
    const { host, pathname } = new URL(String(url));
    if (host === "policy") {
      calls.policy += 1;
      return json({ choices: [{ message: calculatorPolicyMessage(init.body!) }] });
    }
    if (pathname.endsWith("/seed_session")) return json({}, 200, { "set-cookie": "ng_session=s1; Path=/", "x-ng-checkpoint-verify": "replay" });
    if (pathname.endsWith("/tools/calculator")) {
      calls.calculator += 1;
      if (calls.calculator === 1) {
        // The agent's prepare starts while this call is refused (callees close after the agent's stage).
        await agent.closeAdmission();
        return json({ error: { code: "admission_closed", detail: "the restored session is being freed (the last commit left it out); retry" } }, 409);
      }
      return json({ result: 42 });
    }
    if (pathname.endsWith("/verify")) return json({ reward: 1 });
    return json({});
  });
  return calls;
}

/**
 * A tool call refused `admission_closed` right after a delivered policy call parks as a blocker (its
 * latest boundary is stale). When the agent's own admission closes meanwhile, the checkpoint's
 * prepare waits for this very session to reach its next boundary: the park must keep retrying the
 * call, not wait for the agent's own admission to reopen, or the prepare waits for a blocker that
 * waits for the prepare's end (until its deadline: the checkpoint fails).
 */
describe("a tool call refused admission_closed while the agent prepares", () => {
  it("native activation: retried while the agent's admission is closed, so the session reaches its next boundary and stops blocking the prepare", async () => {
    const state = new AgentSessionState();
    const agent = new AgentKind(state);
    const app = createAgentApp({ kind: agent, state, endpoints: { policyUrl: "http://policy", resourcesUrl: "http://resources", stream: false } });
    const calls = stubGym(agent);
    try {
      const opened = await app.inject({ method: "POST", url: "/ng-rollout/r1/open_session", payload: { cookie: "s1" } });
      expect(opened.statusCode).toBe(200);
      const activated = app.inject({ method: "POST", url: "/ng-rollout/r1/activate", payload: { task: { expression: "6*7", tool_rounds: 1 } } });
      await waitUntil(() => calls.calculator >= 1 && agent.sessions.gate.closed, "the first tool call refused");
      await waitUntil(() => calls.calculator === 2 && agent.readiness().blockers.length === 0, "the refused tool call sent again and the session parked at its next boundary");
      expect(agent.sessions.stateOf("r1")).toBe("at_boundary");
      // Exported at the boundary after the tool round: the delivered policy call is never repeated.
      const [exported] = agent.sessions.exportable(null);
      expect((exported!.boundary as { messages: { role: string }[] }).messages.map((m) => m.role)).toEqual(["system", "user", "assistant", "tool"]);
      expect(calls.policy).toBe(1);
      await agent.openAdmission();
      const reply = await activated;
      expect(reply.statusCode).toBe(200);
      expect(reply.json()).toMatchObject({ answer: "42", model_calls: 2 });
      expect(calls).toEqual({ policy: 2, calculator: 2 });
    } finally {
      await agent.openAdmission();
      await app.close();
    }
  });

  it("legacy /run: retried while the agent's admission is closed, so the episode parks at its next boundary instead of blocking the prepare", async () => {
    const state = new AgentSessionState();
    const agent = new AgentKind(state);
    const app = createAgentApp({ kind: agent, state, endpoints: { policyUrl: "http://policy", resourcesUrl: "http://resources", stream: false } });
    const calls = stubGym(agent);
    try {
      const run = app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 0, task: { expression: "6*7", tool_rounds: 1 } } });
      await waitUntil(() => calls.calculator >= 1 && agent.legacy.steps.gate.closed, "the first tool call refused");
      await waitUntil(() => calls.calculator === 2 && agent.readiness().blockers.length === 0, "the refused tool call sent again and the episode parked at its next boundary");
      expect(agent.legacy.steps.states().parked).toBe(1);
      expect(calls.policy).toBe(1);
      await agent.openAdmission();
      const reply = await run;
      expect(reply.statusCode).toBe(200);
      expect(reply.json()).toMatchObject({ reward: 1, answer: "42" });
      expect(calls).toEqual({ policy: 2, calculator: 2 });
    } finally {
      await agent.openAdmission();
      await app.close();
    }
  });
});
