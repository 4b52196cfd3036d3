import { afterEach, describe, expect, it, vi } from "vitest";
import { waitUntil } from "../../support/wait-until.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { AgentKind } from "../../../participants/kinds/agent/index.js";
import { AgentSessionState } from "../../../participants/gym/agent-server/agent-session-state.js";
import { createAgentApp } from "../../../participants/gym/agent-server/agent-server.js";

afterEach(() => vi.unstubAllGlobals());

/** A manual clock that tells when its next timer is due, so the test runs each park retry without sleeping. */
class SteppingClock extends ManualClock {
  private readonly due = new Set<{ at: number }>();

  override setTimer(fn: () => void, ms: number): () => void {
    const entry = { at: this.now() + Math.max(0, ms) };
    this.due.add(entry);
    const cancel = super.setTimer(() => {
      this.due.delete(entry);
      fn();
    }, ms);
    return () => {
      this.due.delete(entry);
      cancel();
    };
  }

  nextDue(): number | undefined {
    const ats = [...this.due].map((e) => e.at);
    return ats.length ? Math.min(...ats) : undefined;
  }
}

const json = (body: unknown, status = 200, headers: Record<string, string> = {}) => new Response(JSON.stringify(body), { status, headers });

/** The first tool call is refused this many times in a row, the second once. */
const FIRST_CALL_REFUSALS = 7;

/**
 * A policy asking for two tool calls in one reply, then answering "42", and a calculator that
 * refuses the first call `admission_closed` FIRST_CALL_REFUSALS times (its checkpoint stays open;
 * the agent's own prepare closes its admission at the first refusal), accepts it, then refuses the
 * second call once. Each calculator call is logged at the clock's time.
 */
function stubGym(agent: AgentKind, clock: ManualClock) {
  const calculator: { at: number; refused: boolean }[] = [];
  const calls = { policy: 0 };
  vi.stubGlobal("fetch", async (url: string, init: { body?: string }) => {
    const { host, pathname } = new URL(String(url));
    if (host === "policy") {
      calls.policy += 1;
      const messages = (JSON.parse(init.body!) as { messages: { role: string }[] }).messages;
      const call = (id: string) => ({ id, type: "function", function: { name: "calculator", arguments: '{"expression":"6*7"}' } });
      const message = messages.at(-1)!.role === "user" ? { role: "assistant", content: null, tool_calls: [call("c1"), call("c2")] } : { role: "assistant", content: "42" };
      return json({ choices: [{ message }] });
    }
    if (pathname.endsWith("/seed_session")) return json({}, 200, { "set-cookie": "ng_session=s1; Path=/", "x-ng-checkpoint-verify": "replay" });
    if (pathname.endsWith("/tools/calculator")) {
      const n = calculator.length;
      const refused = n < FIRST_CALL_REFUSALS || n === FIRST_CALL_REFUSALS + 1;
      calculator.push({ at: clock.now(), refused });
      if (refused) {
        if (n === 0) await agent.closeAdmission();
        return json({ error: { code: "admission_closed", detail: "a checkpoint is open; retry" } }, 409);
      }
      return json({ result: 42 });
    }
    if (pathname.endsWith("/verify")) return json({ reward: 1 });
    return json({});
  });
  return { calculator, calls };
}

/** Fires each park retry's timer once the refused call armed it; returns how long each refused call waited before it was sent again. */
async function runRetries(clock: SteppingClock, calculator: { at: number; refused: boolean }[]): Promise<number[]> {
  const refusals = FIRST_CALL_REFUSALS + 1;
  for (let i = 1; i <= refusals; i++) {
    await waitUntil(() => calculator.filter((c) => c.refused).length === i && clock.nextDue() !== undefined, `refusal ${i} parked`);
    clock.advance(clock.nextDue()! - clock.now());
  }
  await waitUntil(() => calculator.length === refusals + 2, "both tool calls accepted");
  return calculator.flatMap((c, i) => (c.refused ? [calculator[i + 1]!.at - c.at] : []));
}

/** 100 ms doubling per refusal in a row, capped at 2 s; the second call's first refusal starts again from 100 ms. */
const EXPECTED_DELAYS = [100, 200, 400, 800, 1600, 2000, 2000, 100];

/**
 * A callee that keeps refusing a blocked tool call for a whole checkpoint got it sent again every
 * 100 ms per blocked session (thousands of sessions: tens of thousands of requests a second at a
 * paused server). The retry now backs off, and starts over once the callee accepted a call.
 */
describe("a tool call refused admission_closed again and again", () => {
  it("native activation: the retry waits 100 ms, doubling per refusal up to 2 s, and from 100 ms again after an accepted call", async () => {
    const clock = new SteppingClock();
    const state = new AgentSessionState();
    const agent = new AgentKind(state, clock);
    const app = createAgentApp({ kind: agent, state, endpoints: { policyUrl: "http://policy", resourcesUrl: "http://resources", stream: false } });
    const { calculator, calls } = stubGym(agent, clock);
    try {
      const opened = await app.inject({ method: "POST", url: "/ng-rollout/r1/open_session", payload: { cookie: "s1" } });
      expect(opened.statusCode).toBe(200);
      const activated = app.inject({ method: "POST", url: "/ng-rollout/r1/activate", payload: { task: { expression: "6*7", tool_rounds: 1 } } });
      expect(await runRetries(clock, calculator)).toEqual(EXPECTED_DELAYS);
      await waitUntil(() => agent.readiness().blockers.length === 0, "the session parked at its next boundary");
      expect(agent.sessions.stateOf("r1")).toBe("at_boundary");
      await agent.openAdmission();
      const reply = await activated;
      expect(reply.statusCode).toBe(200);
      expect(reply.json()).toMatchObject({ answer: "42", model_calls: 2 });
      expect(calls.policy).toBe(2);
    } finally {
      await agent.openAdmission();
      await app.close();
    }
  });

  it("legacy /run: the same backoff, from 100 ms again after an accepted call", async () => {
    const clock = new SteppingClock();
    const state = new AgentSessionState();
    const agent = new AgentKind(state, clock);
    const app = createAgentApp({ kind: agent, state, endpoints: { policyUrl: "http://policy", resourcesUrl: "http://resources", stream: false } });
    const { calculator, calls } = stubGym(agent, clock);
    try {
      const run = app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 0, task: { expression: "6*7", tool_rounds: 1 } } });
      expect(await runRetries(clock, calculator)).toEqual(EXPECTED_DELAYS);
      await waitUntil(() => agent.readiness().blockers.length === 0, "the episode parked at its next boundary");
      expect(agent.legacy.steps.states().parked).toBe(1);
      await agent.openAdmission();
      const reply = await run;
      expect(reply.statusCode).toBe(200);
      expect(reply.json()).toMatchObject({ reward: 1, answer: "42" });
      expect(calls.policy).toBe(2);
    } finally {
      await agent.openAdmission();
      await app.close();
    }
  });
});
