import { afterEach, describe, expect, it, vi } from "vitest";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { AgentSessionState } from "../../../participants/gym/agent-server/agent-session-state.js";
import { createAgentApp } from "../../../participants/gym/agent-server/agent-server.js";
import { createEnvironmentApp } from "../../../participants/gym/environment-server/environment-server.js";
import { calculatorPolicyMessage } from "../agent/calculator-policy.js";

afterEach(() => vi.unstubAllGlobals());

/**
 * A `/run` whose episode failed because a callee refused one of its calls answers `upstream_failed`
 * (a dependency failed), naming the call and the callee's code in its detail. Passed on unchanged,
 * the callee's code read as the `/run`'s own: a resources server's `stale_attempt` or
 * `admission_closed` as "this attempt never started", its `invalid_request` as "the task is bad"
 * (gym-ckpt collect fails such a row for good), its `not_found` as an unknown route. A callee's
 * `storage_error` (the deployment's storage: the model proxy's ledger disk full) and
 * `upstream_failed` keep their code, which means the same to the caller.
 */
type Refusal = { status: number; code: string; detail: string };
const TASK = { expression: "6*7", tool_rounds: 1 };
const json = (body: unknown, status = 200, headers: Record<string, string> = {}) => new Response(JSON.stringify(body), { status, headers });
const refusal = (r: Refusal) => json({ error: { code: r.code, detail: r.detail } }, r.status);

/** How a route is refused: always so, or as a function says for each call (undefined: answered). */
type Refusing = Record<string, Refusal | (() => Refusal | undefined)>;

/** Callees that answer every call, except `refuse[route]` (a path suffix) which is refused so. */
function stubCallees(refuse: Refusing, agentApp?: ReturnType<typeof createAgentApp>): void {
  vi.stubGlobal("fetch", async (url: string, init: { body?: string }) => {
    const { host, pathname } = new URL(String(url));
    const refused = Object.entries(refuse).find(([route]) => pathname.endsWith(route))?.[1];
    const answer = typeof refused === "function" ? refused() : refused;
    if (answer) return refusal(answer);
    if (host === "agent" && agentApp) {
      const res = await agentApp.inject({ method: "POST", url: pathname, payload: init.body ?? "{}", headers: { "content-type": "application/json" } });
      return new Response(res.body, { status: res.statusCode });
    }
    if (host === "policy") return json({ choices: [{ message: calculatorPolicyMessage(init.body!) }] });
    if (pathname.endsWith("/seed_session")) return json({}, 200, { "set-cookie": "ng_session=s1; Path=/" });
    if (pathname.endsWith("/tools/calculator")) return json({ result: 42 });
    if (pathname.endsWith("/verify")) return json({ reward: 1 });
    if (pathname.endsWith("/activate")) return json({ answer: "42", messages: [] });
    return json({});
  });
}

async function environmentRun(refuse: Refusing) {
  stubCallees(refuse);
  const app = createEnvironmentApp({ kind: new EnvironmentKind(), endpoints: { agentUrl: "http://agent", resourcesUrl: "http://resources" } });
  try {
    const res = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 0, task: TASK } });
    return { status: res.statusCode, ...(res.json() as { error: { code: string; detail: string } }).error };
  } finally {
    await app.close();
  }
}

async function legacyAgentRun(refuse: Refusing) {
  stubCallees(refuse);
  const state = new AgentSessionState();
  const app = createAgentApp({ kind: new AgentKind(state), state, endpoints: { policyUrl: "http://policy", resourcesUrl: "http://resources", stream: false } });
  try {
    const res = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 0, task: TASK } });
    return { status: res.statusCode, ...(res.json() as { error: { code: string; detail: string } }).error };
  } finally {
    await app.close();
  }
}

const CALLEE_CODES: Refusal[] = [
  { status: 400, code: "invalid_request", detail: "session r1 is open with another cookie; close it first" },
  { status: 409, code: "stale_attempt", detail: "r1 was retired" },
  { status: 409, code: "admission_closed", detail: "a checkpoint is open; a restart_only server starts no session until resume" },
  { status: 409, code: "invalid_phase", detail: "not now" },
  { status: 404, code: "not_found", detail: "no such route" },
  { status: 500, code: "internal_error", detail: "boom" },
];

describe("a /run whose callee refused a call", () => {
  it("environment: the agent's activate or the resources server's seed refusing answers upstream_failed, the callee's code in the detail", async () => {
    for (const callee of CALLEE_CODES) {
      for (const route of ["/activate", "/seed_session"]) {
        if (callee.code === "admission_closed") continue; // the episode parks and sends it again (below)
        const answered = await environmentRun({ [route]: callee });
        expect({ route, code: callee.code, answered: [answered.status, answered.code] }).toEqual({ route, code: callee.code, answered: [502, "upstream_failed"] });
        expect(answered.detail).toContain(`${route.slice(1)} refused with ${callee.code}: ${callee.detail}`);
      }
    }
  });

  it("legacy agent /run: the resources server's seed or the policy refusing answers upstream_failed, the callee's code in the detail", async () => {
    for (const callee of CALLEE_CODES) {
      if (callee.code === "admission_closed") continue; // the episode parks and sends it again (below)
      const answered = await legacyAgentRun({ "/seed_session": callee });
      expect({ code: callee.code, answered: [answered.status, answered.code] }).toEqual({ code: callee.code, answered: [502, "upstream_failed"] });
      expect(answered.detail).toContain(`seed_session refused with ${callee.code}`);
    }
    const policy = await legacyAgentRun({ "/v1/chat/completions": { status: 404, code: "not_found", detail: "no such model" } });
    expect([policy.status, policy.code]).toEqual([502, "upstream_failed"]);
    expect(policy.detail).toContain("policy refused with not_found: no such model");
  });

  it.each([
    ["environment", environmentRun],
    ["legacy agent", legacyAgentRun],
  ])("%s /run: a seed the resources server refused admission_closed (it never ran) parks and is sent again; the run answers its reward", async (_name, run) => {
    // Refused twice, then taken: a resources server that refuses seeds while its checkpoint is open.
    const closed: Refusal = { status: 409, code: "admission_closed", detail: "a checkpoint is open" };
    let seeds = 0;
    const answered = await run({ "/seed_session": () => (++seeds <= 2 ? closed : undefined) });
    expect(answered).toMatchObject({ status: 200 });
    expect(seeds).toBe(3);
  });

  it("a callee's storage_error and upstream_failed keep their code", async () => {
    for (const callee of [
      { status: 507, code: "storage_error", detail: "ENOSPC: no space left on device, write '/ledger/x'" },
      { status: 502, code: "upstream_failed", detail: "the inference server closed the connection" },
    ]) {
      const env = await environmentRun({ "/activate": callee });
      expect([env.status, env.code]).toEqual([callee.status, callee.code]);
      const legacy = await legacyAgentRun({ "/v1/chat/completions": callee });
      expect([legacy.status, legacy.code]).toEqual([callee.status, callee.code]);
    }
  });

  it("the native activate answers its callees' refusals as upstream_failed too, so the environment's detail names both calls", async () => {
    const state = new AgentSessionState();
    const agentApp = createAgentApp({ kind: new AgentKind(state), state, endpoints: { policyUrl: "http://policy", resourcesUrl: "http://resources", stream: false } });
    stubCallees({ "/tools/calculator": { status: 409, code: "stale_attempt", detail: "session of r1 was retired" } }, agentApp);
    const app = createEnvironmentApp({ kind: new EnvironmentKind(), endpoints: { agentUrl: "http://agent", resourcesUrl: "http://resources" } });
    try {
      const res = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 0, task: TASK } });
      expect([res.statusCode, res.json().error.code]).toEqual([502, "upstream_failed"]);
      expect(res.json().error.detail).toContain("calculator refused with stale_attempt: session of r1 was retired");
    } finally {
      await app.close();
      await agentApp.close();
    }
  });
});
