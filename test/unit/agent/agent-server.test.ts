import { afterEach, describe, expect, it, vi } from "vitest";
import { canonicalDigest } from "../../../protocol/index.js";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { AgentSessionState } from "../../../participants/gym/agent-server/agent-session-state.js";
import { createAgentApp } from "../../../participants/gym/agent-server/agent-server.js";
import { RECORDED_AND_SENT_SPELLINGS, expectRestoredTaskChecks } from "../../support/task-spellings.js";

describe("reference agent server", () => {
  it("answers a native route sent without the /ng-rollout/<capture_key>/ prefix rollout_id_required, an unknown path not_found", async () => {
    const state = new AgentSessionState();
    const kind = new AgentKind(state);
    const app = createAgentApp({ kind, state, endpoints: { policyUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9", stream: false } });
    try {
      for (const route of ["open_session", "activate", "close_session"]) {
        const res = await app.inject({ method: "POST", url: `/${route}`, payload: {} });
        expect({ route, status: res.statusCode, code: res.json().error?.code }).toEqual({ route, status: 400, code: "rollout_id_required" });
      }
      expect(state.sessions.size).toBe(0); // nothing opened
      for (const url of ["/nowhere", "/ng-rollout/r1/nowhere"]) {
        const res = await app.inject({ method: "POST", url, payload: {} });
        expect({ url, status: res.statusCode, code: res.json().error?.code }).toEqual({ url, status: 404, code: "not_found" });
      }
    } finally {
      await app.close();
    }
  });

  it("native activate refuses a seed that starts with a system message invalid_request, before the session is activated", async () => {
    const state = new AgentSessionState();
    const kind = new AgentKind(state);
    const app = createAgentApp({ kind, state, endpoints: { policyUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9", stream: false } });
    try {
      expect((await app.inject({ method: "POST", url: "/ng-rollout/r1/open_session", payload: {} })).statusCode).toBe(200);
      const before = kind.sessions.states();
      const seed = [
        { role: "system", content: "the recorded system prompt" },
        { role: "user", content: "what is 1+1?" },
      ];
      const res = await app.inject({ method: "POST", url: "/ng-rollout/r1/activate", payload: { task: { expression: "1+1", tool_rounds: 1 }, seed } });
      expect({ status: res.statusCode, code: res.json().error?.code }).toEqual({ status: 400, code: "invalid_request" });
      expect(res.json().error.detail).toMatch(/system/);
      expect(kind.sessions.states()).toEqual(before); // still open, not activated
    } finally {
      await app.close();
    }
  });

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

  it("legacy /run takes a restored record digested with or without the task's defaults, and refuses another task with invalid_request", async () => {
    for (const [recorded, sent] of RECORDED_AND_SENT_SPELLINGS) {
      const state = new AgentSessionState();
      const kind = new AgentKind(state);
      await kind.install([
        { episode_id: { rollout_id: "r1", attempt: 1 }, mode: "legacy", session_key: "r1", session: { task_digest: canonicalDigest(recorded) }, boundary: null, episode: { next: "bogus" } },
      ]);
      const app = createAgentApp({ kind, state, endpoints: { policyUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9", stream: false } });
      try {
        await expectRestoredTaskChecks(app, sent);
        expect(kind.legacy.pendingKeys()).toEqual(["r1-a2"]);
        expect(kind.legacy.steps.size).toBe(0);
      } finally {
        await app.close();
      }
    }
  });

  it("native activate refuses a restored boundary that is not a turn-loop state with invalid_checkpoint_state, keeping the restored session", async () => {
    const state = new AgentSessionState();
    const kind = new AgentKind(state);
    const task = { expression: "1+1", tool_rounds: 1 };
    // Passes the agent record schema (a boundary is any object) but is no turn-loop state.
    await kind.install([
      { episode_id: { rollout_id: "r1", attempt: 0 }, mode: "session", session_key: "r1", session: { cookie: null }, boundary: { messages: "bogus" }, episode: null },
    ]);
    // Unreachable callees: an activation that started over from the task would fail with another code.
    const app = createAgentApp({ kind, state, endpoints: { policyUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9", stream: false } });
    try {
      const open = await app.inject({ method: "POST", url: "/ng-rollout/r1-a1/open_session", payload: {} });
      expect(open.json()).toEqual({ session_key: "r1", restored: true });
      // Each refusal changes nothing, so a retry is refused the same way instead of starting the rollout over.
      for (let i = 0; i < 2; i++) {
        const res = await app.inject({ method: "POST", url: "/ng-rollout/r1-a1/activate", payload: { task } });
        expect({ status: res.statusCode, code: res.json().error?.code }).toEqual({ status: 422, code: "invalid_checkpoint_state" });
        expect(kind.sessions.restoredPending).toBe(1);
        expect(kind.sessions.stateOf("r1")).toBe("idle");
      }
    } finally {
      await app.close();
    }
  });

  it("a legacy /run that fails before its verify ended its resources session closes it there, with its cookie", async () => {
    const closes: (string | null)[] = [];
    vi.stubGlobal("fetch", async (url: string, init: { headers?: Record<string, string> }) => {
      const path = new URL(String(url)).pathname;
      if (path.endsWith("/seed_session")) return new Response("{}", { status: 200, headers: { "set-cookie": "ng_session=s-9; Path=/" } });
      if (path.endsWith("/close_session")) {
        closes.push(init.headers?.cookie ?? null);
        return new Response("{}", { status: 200 });
      }
      // The policy refuses the task for good.
      return new Response(JSON.stringify({ error: { code: "invalid_request", detail: "scripted" } }), { status: 400 });
    });
    const state = new AgentSessionState();
    const kind = new AgentKind(state);
    const app = createAgentApp({ kind, state, endpoints: { policyUrl: "http://policy", resourcesUrl: "http://resources", stream: false } });
    try {
      const res = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r7", attempt: 0, task: { expression: "1+1", tool_rounds: 1 } } });
      // The policy's refusal, answered as a dependency's (run-callee-refusal.test.ts).
      expect(res.json()).toMatchObject({ error: { code: "upstream_failed", detail: expect.stringContaining("policy refused with invalid_request: scripted") } });
      expect(closes).toEqual(["ng_session=s-9"]);
    } finally {
      await app.close();
    }
  });
});

afterEach(() => void vi.unstubAllGlobals());
