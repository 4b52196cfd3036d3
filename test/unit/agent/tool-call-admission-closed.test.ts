import { afterEach, describe, expect, it, vi } from "vitest";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { AgentSessionState } from "../../../participants/gym/agent-server/agent-session-state.js";
import { createAgentApp } from "../../../participants/gym/agent-server/agent-server.js";
import { runGymEpisode } from "../../../participants/gym/environment-server/gym-episode.js";
import { calculatorPolicyMessage } from "./calculator-policy.js";

afterEach(() => vi.unstubAllGlobals());

/**
 * A tool call refused `admission_closed` (a restart_only resources server during a checkpoint, a
 * restored session being freed) changed nothing there, so the turn loop parks and sends it again,
 * as it does a refused policy call. Passed on, it ended the activation with that code, which the
 * environment takes for "the activation did not run" and sends again: the new activation started
 * the turn loop over and called the policy again for every turn already done.
 */
describe("a tool call refused admission_closed", () => {
  it("parks and is sent again inside the activation: the environment's episode makes each policy call once", async () => {
    const state = new AgentSessionState();
    const agent = new AgentKind(state);
    const app = createAgentApp({ kind: agent, state, endpoints: { policyUrl: "http://policy", resourcesUrl: "http://resources", stream: false } });
    const calls = { policy: 0, calculator: 0, activate: 0 };
    const json = (body: unknown, status = 200, headers: Record<string, string> = {}) => new Response(JSON.stringify(body), { status, headers });
    vi.stubGlobal("fetch", async (url: string, init: { body?: string; headers?: Record<string, string> }) => {
      const { host, pathname } = new URL(String(url));
      if (host === "agent") {
        if (pathname.endsWith("/activate")) calls.activate += 1;
        const res = await app.inject({ method: "POST", url: pathname, payload: init.body ?? "{}", headers: { "content-type": "application/json" } });
        return new Response(res.body, { status: res.statusCode });
      }
      if (host === "policy") {
        calls.policy += 1;
        return json({ choices: [{ message: calculatorPolicyMessage(init.body!) }] });
      }
      if (pathname.endsWith("/seed_session")) return json({}, 200, { "set-cookie": "ng_session=s1; Path=/" });
      if (pathname.endsWith("/tools/calculator")) {
        calls.calculator += 1;
        if (calls.calculator === 1) return json({ error: { code: "admission_closed", detail: "a checkpoint is open; a restart_only server starts no session until resume" } }, 409);
        return json({ result: 42 });
      }
      if (pathname.endsWith("/verify")) return json({ reward: 1 });
      return json({});
    });
    try {
      const env = new EnvironmentKind();
      const task = { expression: "6*7", tool_rounds: 1 };
      const result = await env.begin({ rollout_id: "r1", attempt: 0 }, task, {}, (ep) => runGymEpisode({ agentUrl: "http://agent", resourcesUrl: "http://resources" }, ep, task));
      expect(result).toMatchObject({ reward: 1, answer: "42" });
      expect(calls).toEqual({ policy: 2, calculator: 2, activate: 1 });
      expect(result.messages!.map((m) => m.role)).toEqual(["system", "user", "assistant", "tool", "assistant"]);
    } finally {
      await app.close();
    }
  });
});
