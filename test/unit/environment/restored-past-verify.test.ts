import { afterEach, describe, expect, it, vi } from "vitest";
import { canonicalDigest } from "../../../protocol/index.js";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { AgentSessionState } from "../../../participants/gym/agent-server/agent-session-state.js";
import { createAgentApp } from "../../../participants/gym/agent-server/agent-server.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { runGymEpisode } from "../../../participants/gym/environment-server/gym-episode.js";
import { CalculatorServer } from "../../../participants/gym/resources-server/calculator-server.js";
import { resourcesWorld } from "../resources/resources-world.js";
import { waitUntil } from "../../support/wait-until.js";

afterEach(() => vi.unstubAllGlobals());

/**
 * A replayable verify that ends while a checkpoint is open ends its session only when that
 * checkpoint closes, so the resources server checkpoints the session, while the environment,
 * parked at {next:"return"} by then, checkpoints the finished episode. A restore brings both back:
 * the restored episode returns the recorded result, and must end the restored session as its
 * verify did, or it stays open (restored, never claimed) at the resources server for good.
 */
describe("an episode restored past its verify", () => {
  it("records the session cookie in its return boundary and closes the restored session", async () => {
    const world = await resourcesWorld();
    try {
      const firstCalculator = new CalculatorServer();
      const before = await world.harness(firstCalculator);
      const beforeUrl = await before.app.listen({ host: "127.0.0.1", port: 0 });
      const after = await world.harness(new CalculatorServer());
      const afterUrl = await after.app.listen({ host: "127.0.0.1", port: 0 });
      const realFetch = globalThis.fetch;
      // The agent is a stub; the resources servers are real.
      vi.stubGlobal("fetch", async (url: string, init: RequestInit) => {
        const u = String(url);
        if (u.startsWith(beforeUrl) || u.startsWith(afterUrl)) return realFetch(url, init);
        if (u.endsWith("/activate")) return new Response(JSON.stringify({ answer: "2", model_calls: 1, continued: false }), { status: 200 });
        return new Response(JSON.stringify({ session_key: "r1", restored: false }), { status: 200 });
      });
      const task = { expression: "1+1", tool_rounds: 1 };

      // The first process: its verify is held, then ends while a checkpoint is open.
      firstCalculator.controls.hold();
      const first = new EnvironmentKind();
      const lost = first.begin({ rollout_id: "r1", attempt: 0 }, task, {}, (ep) => runGymEpisode({ agentUrl: "http://agent", resourcesUrl: beforeUrl }, ep, task));
      await waitUntil(() => firstCalculator.controls.stats.verify_started === 1, "the verify to start", 2000);
      await first.closeAdmission();
      expect(await before.call("prepare", { checkpoint_id: "c1" })).toMatchObject({ phase: "prepared" });
      firstCalculator.controls.release();
      await waitUntil(() => first.episodes.steps.states().parked === 1, "the episode to park at return", 2000);
      const records = await first.exportRecords(null);
      expect(records.map((r) => r.boundary)).toEqual([{ next: "return", cookie: expect.any(String), answer: "2", reward: 1 }]);
      await before.call("commit", { checkpoint_id: "c1" });
      // The crash: the first process's /run is never answered.
      void lost.catch(() => undefined);

      // The replacement processes restore the checkpoint.
      await after.call("restore", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
      await after.call("resume", { checkpoint_id: "c1" });
      expect(after.kind.readiness().counts).toMatchObject({ sessions: 1, restored: 1 });
      const second = new EnvironmentKind();
      await second.install(records);
      const result = await second.begin({ rollout_id: "r1", attempt: 1 }, task, {}, (ep) => runGymEpisode({ agentUrl: "http://agent", resourcesUrl: afterUrl }, ep, task));
      expect(result).toMatchObject({ reward: 1, answer: "2", continued_from: "return" });
      // Closed as the verify would have: nothing left at the resources server, and no verify run again.
      expect(after.kind.readiness().counts).toMatchObject({ sessions: 0, restored: 0 });
      expect(after.kind.hasLiveState()).toBe(false);
    } finally {
      await world.close();
    }
  });

  /** Every call the episode makes, with the cookie it carries; the callees answer as a finished episode's would. */
  function recordCalls() {
    const calls: { call: string; cookie: string | null }[] = [];
    vi.stubGlobal("fetch", async (url: string, init: { headers?: Record<string, string> }) => {
      const u = new URL(String(url));
      calls.push({ call: `${u.host}${u.pathname}`, cookie: init.headers?.cookie ?? null });
      return new Response("{}", { status: 200 });
    });
    return calls;
  }

  it("an older return boundary (no cookie) returns its result and closes only the agent session", async () => {
    const calls = recordCalls();
    const env = new EnvironmentKind();
    const task = { expression: "1+1", tool_rounds: 1 };
    await env.install([{ episode_id: { rollout_id: "r1", attempt: 0 }, task_digest: canonicalDigest(task), boundary: { next: "return", answer: "2", reward: 1 } }]);
    const result = await env.begin({ rollout_id: "r1", attempt: 1 }, task, {}, (ep) => runGymEpisode({ agentUrl: "http://agent", resourcesUrl: "http://resources" }, ep, task));
    expect(result).toMatchObject({ reward: 1, continued_from: "return" });
    expect(calls).toEqual([{ call: "agent/ng-rollout/r1-a1/close_session", cookie: null }]);
  });

  it("the agent's legacy /run restored at its return boundary closes the restored resources session with its cookie", async () => {
    const state = new AgentSessionState();
    const kind = new AgentKind(state);
    const task = { expression: "1+1", tool_rounds: 1 };
    await kind.install([
      {
        episode_id: { rollout_id: "r1", attempt: 0 },
        mode: "legacy",
        session_key: "r1",
        session: { task_digest: canonicalDigest(task) },
        boundary: null,
        episode: { next: "return", cookie: "s-1", answer: "2", reward: 1 },
      },
    ]);
    const app = createAgentApp({ kind, state, endpoints: { policyUrl: "http://policy", resourcesUrl: "http://resources", stream: false } });
    try {
      const calls = recordCalls();
      const res = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 1, task } });
      expect(res.json()).toMatchObject({ reward: 1, answer: "2", continued_from: "return" });
      expect(calls).toEqual([{ call: "resources/ng-rollout/r1-a1/close_session", cookie: "ng_session=s-1" }]);
    } finally {
      await app.close();
    }
  });
});
