import { describe, expect, it } from "vitest";
import { AgentKind, type RestoredAgentSession } from "../../../participants/kinds/agent/index.js";
import { AgentSessionState } from "../../../participants/gym/agent-server/agent-session-state.js";
import { createAgentApp } from "../../../participants/gym/agent-server/agent-server.js";

/**
 * The agent sends an open session's cookie to the resources server as `cookie: ng_session=<value>`
 * on every tool call, so open_session takes only an RFC 6265 cookie-value (cookie-octets): a CTL
 * would fail every tool call, a `;` or `,` would add cookies of the caller's choosing.
 */
describe("reference agent open_session: the cookie value", () => {
  const app = () => {
    const state = new AgentSessionState();
    const kind = new AgentKind(state);
    const server = createAgentApp({ kind, state, endpoints: { policyUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9", stream: false } });
    return { state, kind, server };
  };

  it.each([
    ["a semicolon (another cookie)", "abc; admin=1"],
    ["a comma", "abc,def"],
    ["a space", "abc def"],
    ["a tab", "abc\tdef"],
    ["a CR LF (header injection)", "abc\r\nx-evil: 1"],
    ["a control character", "abc\u0001"],
    ["DEL", "abc\u007f"],
    ["a double quote", 'a"b'],
    ["an unbalanced quote", '"ab'],
    ["a quoted value with a space", '"a b"'],
    ["a backslash", "a\\b"],
    ["a non-ASCII character", "caf\u00e9"],
  ])("refuses a cookie with %s with invalid_request, opening nothing", async (_what, cookie) => {
    const { state, kind, server } = app();
    try {
      const res = await server.inject({ method: "POST", url: "/ng-rollout/r1/open_session", payload: { cookie } });
      expect(res.statusCode).toBe(400);
      expect(res.json()).toMatchObject({ error: { code: "invalid_request" } });
      expect(kind.sessions.has("r1")).toBe(false);
      expect(state.get("r1")).toBeUndefined();
    } finally {
      await server.close();
    }
  });

  it.each([["a session id", "AbC-123_xyz"], ["cookie-octets", "a!#$%&'()*+-./:<=>?@[]^_`{|}~9"], ["a quoted value (RFC 6265 allows it)", '"AbC-123"'], ["null", null]])("accepts %s", async (_what, cookie) => {
    const { state, kind, server } = app();
    try {
      const res = await server.inject({ method: "POST", url: "/ng-rollout/r1/open_session", payload: { cookie } });
      expect(res.statusCode).toBe(200);
      expect(kind.sessions.has("r1")).toBe(true);
      expect(state.get("r1")).toEqual({ cookie });
    } finally {
      await server.close();
    }
  });

  it("open_session again for the open session (same attempt) keeps its cookie: another one is refused invalid_request, changing nothing", async () => {
    const { state, kind, server } = app();
    try {
      const open = (cookie: string | null) => server.inject({ method: "POST", url: "/ng-rollout/r1/open_session", payload: { cookie } });
      expect((await open("A")).statusCode).toBe(200);
      await kind.closeAdmission();
      // The session's state (what a commit exports, what its activation's tool calls carry) stays A.
      expect((await open("A")).statusCode).toBe(200);
      expect((await open(null)).statusCode).toBe(200);
      const other = await open("B");
      expect(other.statusCode).toBe(400);
      expect(other.json()).toMatchObject({ error: { code: "invalid_request" } });
      expect(state.get("r1")).toEqual({ cookie: "A" });
      expect(await kind.exportRecords(null)).toMatchObject([{ session_key: "r1", session: { cookie: "A" } }]);
    } finally {
      await kind.openAdmission();
      await server.close();
    }
  });

  it("a restored session state whose cookie is no cookie-value is refused invalid_checkpoint_state, installing nothing", async () => {
    const state = new AgentSessionState();
    const restored: RestoredAgentSession[] = [
      { session_key: "a", episode_id: { rollout_id: "a", attempt: 0 }, session: { cookie: "good" } },
      { session_key: "b", episode_id: { rollout_id: "b", attempt: 0 }, session: { cookie: "bad; admin=1" } },
    ];
    await expect(state.restoreAgentSessions(restored)).rejects.toMatchObject({ code: "invalid_checkpoint_state" });
    expect(state.sessions.size).toBe(0);
  });
});
