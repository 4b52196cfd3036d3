import pino from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { AgentSessionState } from "../../../participants/gym/agent-server/agent-session-state.js";
import { createAgentApp } from "../../../participants/gym/agent-server/agent-server.js";
import { createEnvironmentApp } from "../../../participants/gym/environment-server/environment-server.js";

/**
 * docs/errors.md: internal_error is "an unexpected failure inside gym-ckpt: check the logs (they carry
 * the trace id) and report a bug". The environment and agent servers answered a route's
 * internal_error without a log line (each route caught it and sent the refusal), so their logs held
 * nothing of it: no stack, no episode. A refusal with any other code is the caller's or a callee's
 * and stays out of the error log.
 */
afterEach(() => vi.unstubAllGlobals());

function capturingLogger(): { logger: pino.Logger; errors: () => { msg: string; err?: { message?: string; stack?: string } }[] } {
  const lines: string[] = [];
  const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(line) });
  return { logger, errors: () => lines.map((l) => JSON.parse(l) as { level: number; msg: string; err?: { message?: string } }).filter((l) => l.level >= 50) };
}

/** Callees answering each path's last segment from `answers` (JSON, 200), anything else `{}`. */
function stubCallees(answers: Record<string, unknown>): void {
  vi.stubGlobal("fetch", async (url: string) => {
    const route = new URL(String(url)).pathname.split("/").at(-1)!;
    const headers = route === "seed_session" ? { "set-cookie": "ng_session=abc; Path=/" } : undefined;
    return new Response(JSON.stringify(answers[route] ?? {}), { status: 200, ...(headers && { headers }) });
  });
}

const task = { expression: "1+1", tool_rounds: 1 };

describe("reference Gym servers, an internal_error answered by a route", () => {
  it("the environment server logs it with its error", async () => {
    stubCallees({ activate: { answer: 42 } }); // the agent's answer is no string: a bug on that side
    const { logger, errors } = capturingLogger();
    const app = createEnvironmentApp({ kind: new EnvironmentKind(), logger, endpoints: { agentUrl: "http://agent", resourcesUrl: "http://resources" } });
    try {
      const res = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 0, task } });
      expect([res.statusCode, res.json().error?.code]).toEqual([500, "internal_error"]);
      expect(errors()).toEqual([expect.objectContaining({ err: expect.objectContaining({ message: expect.stringContaining("answer") }) })]);
      // A caller's refusal is no error of ours: not logged as one.
      const bad = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r2", attempt: 0, task: {} } });
      expect(bad.statusCode).toBe(400);
      expect(errors()).toHaveLength(1);
    } finally {
      await app.close();
    }
  });

  it("the agent server logs it with its error", async () => {
    stubCallees({ completions: { choices: [] } }); // a policy reply without a message
    const { logger, errors } = capturingLogger();
    const state = new AgentSessionState();
    const app = createAgentApp({ kind: new AgentKind(state), state, logger, endpoints: { policyUrl: "http://policy", resourcesUrl: "http://resources", stream: false } });
    try {
      expect((await app.inject({ method: "POST", url: "/ng-rollout/r1/open_session", payload: {} })).statusCode).toBe(200);
      const res = await app.inject({ method: "POST", url: "/ng-rollout/r1/activate", payload: { task } });
      expect([res.statusCode, res.json().error?.code]).toEqual([500, "internal_error"]);
      expect(errors()).toEqual([expect.objectContaining({ err: expect.objectContaining({ message: expect.stringContaining("without a message") }) })]);
    } finally {
      await app.close();
    }
  });
});
