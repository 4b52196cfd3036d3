import { afterEach, describe, expect, it, vi } from "vitest";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { AgentSessionState } from "../../../participants/gym/agent-server/agent-session-state.js";
import { createAgentApp } from "../../../participants/gym/agent-server/agent-server.js";
import { MAX_SEED_BYTES } from "../../../participants/gym/agent-server/tool-calling-agent.js";
import { DEFAULT_MAX_BODY_BYTES } from "../../../participants/attach/attach-proxy.js";

/**
 * The size of a seed `activate` takes. The agent keeps the model's reasoning on its turns, so the
 * seeds exported from its checkpoints (and records of its trajectories) carry it: a reasoning
 * policy's conversation of a few turns passes 1 MiB, the limit every Gym route had, and its replay
 * was refused payload_too_large at activate (the environment's /run: upstream_failed, after seeding).
 */
afterEach(() => vi.unstubAllGlobals());

const task = { expression: "6*7", tool_rounds: 2 };
const call = (id: string) => ({ id, type: "function", function: { name: "calculator", arguments: '{"expression":"6*7"}' } });
/** A seed ending in a complete tool run, each assistant turn with `thought` characters of reasoning. */
function reasoningSeed(thought: number): Record<string, unknown>[] {
  return [
    { role: "user", content: "Compute: 6*7" },
    { role: "assistant", content: null, reasoning_content: "a".repeat(thought), tool_calls: [call("c1")] },
    { role: "tool", tool_call_id: "c1", content: '{"result":"42"}' },
    { role: "assistant", content: null, reasoning_content: "b".repeat(thought), tool_calls: [call("c2")] },
    { role: "tool", tool_call_id: "c2", content: '{"result":"42"}' },
  ];
}

/** reasoningSeed padded to exactly `bytes` as JSON (the size the environment checks). */
function seedOfBytes(bytes: number): Record<string, unknown>[] {
  const base = Buffer.byteLength(JSON.stringify(reasoningSeed(0)));
  const seed = reasoningSeed(Math.floor((bytes - base) / 2));
  seed[0]!.content = `Compute: 6*7${" ".repeat((bytes - base) % 2)}`;
  expect(Buffer.byteLength(JSON.stringify(seed))).toBe(bytes);
  return seed;
}

async function agentApp() {
  const state = new AgentSessionState();
  const kind = new AgentKind(state);
  const app = createAgentApp({ kind, state, endpoints: { policyUrl: "http://policy", resourcesUrl: "http://resources", stream: false } });
  await app.ready();
  return app;
}

describe("agent activate: a seed carrying the model's reasoning", () => {
  it("takes a seed over 1 MiB and sends it whole to the policy", async () => {
    const sent: { messages: Record<string, unknown>[] }[] = [];
    vi.stubGlobal("fetch", async (_url: string, init: { body: string }) => {
      sent.push(JSON.parse(init.body));
      return new Response(JSON.stringify({ choices: [{ message: { role: "assistant", content: "42" } }] }), { status: 200 });
    });
    const app = await agentApp();
    try {
      const seed = reasoningSeed(700_000); // some 1.4 MB
      expect((await app.inject({ method: "POST", url: "/ng-rollout/r1/open_session", payload: {} })).statusCode).toBe(200);
      const res = await app.inject({ method: "POST", url: "/ng-rollout/r1/activate", payload: { task, seed } });
      expect({ status: res.statusCode, code: res.json().error?.code }).toEqual({ status: 200, code: undefined });
      expect(res.json().answer).toBe("42");
      expect(sent[0]!.messages.slice(1)).toEqual(seed);
    } finally {
      await app.close();
    }
  });

  it("sends the largest seed it takes in a first policy call the attach proxy reads (its default body limit)", async () => {
    let firstCallBytes: number | undefined;
    vi.stubGlobal("fetch", async (_url: string, init: { body: string }) => {
      firstCallBytes ??= Buffer.byteLength(init.body);
      return new Response(JSON.stringify({ choices: [{ message: { role: "assistant", content: "42" } }] }), { status: 200 });
    });
    const app = await agentApp();
    try {
      expect((await app.inject({ method: "POST", url: "/ng-rollout/r1/open_session", payload: {} })).statusCode).toBe(200);
      const res = await app.inject({ method: "POST", url: "/ng-rollout/r1/activate", payload: { task, seed: seedOfBytes(MAX_SEED_BYTES) } });
      expect(res.statusCode).toBe(200);
      expect(firstCallBytes).toBeLessThanOrEqual(DEFAULT_MAX_BODY_BYTES);
    } finally {
      await app.close();
    }
  });

  it("refuses a seed past MAX_SEED_BYTES payload_too_large", async () => {
    const app = await agentApp();
    try {
      expect((await app.inject({ method: "POST", url: "/ng-rollout/r1/open_session", payload: {} })).statusCode).toBe(200);
      const res = await app.inject({ method: "POST", url: "/ng-rollout/r1/activate", payload: { task, seed: reasoningSeed(MAX_SEED_BYTES / 2 + 64 * 1024) } });
      expect({ status: res.statusCode, code: res.json().error?.code }).toEqual({ status: 413, code: "payload_too_large" });
    } finally {
      await app.close();
    }
  });
});
