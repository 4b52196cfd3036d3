import pino from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { runGymEpisode } from "../../../participants/gym/environment-server/gym-episode.js";
import { CalculatorServer } from "../../../participants/gym/resources-server/calculator-server.js";
import { resourcesWorld } from "../resources/resources-world.js";
import { waitUntil } from "../../support/wait-until.js";

afterEach(() => vi.unstubAllGlobals());

/** Rejects after `ms` so a hang fails the test quickly instead of at the test timeout. */
function within<T>(ms: number, work: Promise<T>): Promise<T> {
  return Promise.race([work, new Promise<T>((_, reject) => setTimeout(() => reject(new Error(`still pending after ${ms} ms`)), ms))]);
}

describe("reference environment episode", () => {
  it("retire during final clean-up ends within the close_session timeout when the agent never answers it", async () => {
    let closeCalled!: () => void;
    const closing = new Promise<void>((resolve) => (closeCalled = resolve));
    vi.stubGlobal("fetch", async (url: string, init: { signal?: AbortSignal }) => {
      const u = String(url);
      const json = (body: unknown) => new Response(JSON.stringify(body), { status: 200 });
      if (u.endsWith("/seed_session")) return json({});
      if (u.endsWith("/open_session")) return json({ session_key: "r1", restored: false });
      if (u.endsWith("/activate")) return json({ answer: "2", model_calls: 2, continued: false });
      if (u.endsWith("/verify")) return json({ reward: 1 });
      // close_session: a hung agent, answering only the caller's abort.
      closeCalled();
      return new Promise<Response>((_, reject) => init.signal?.addEventListener("abort", () => reject(init.signal!.reason)));
    });
    const kind = new EnvironmentKind();
    const episode = { rollout_id: "r1", attempt: 1 };
    const task = { expression: "1+1", tool_rounds: 1 };
    const run = kind.begin(episode, task, {}, (ep) =>
      runGymEpisode({ agentUrl: "http://agent", resourcesUrl: "http://resources" }, ep, task, { closeSessionTimeoutMs: 50 }),
    );
    await closing;
    await within(2000, kind.episodes.retire([episode]));
    expect(kind.episodes.steps.size).toBe(0);
    expect(kind.episodes.steps.blockers()).toEqual([]);
    // Retire waits for the clean-up instead of interrupting it, so the episode still delivers its result.
    expect(await run).toMatchObject({ reward: 1, answer: "2" });
  });

  it("a verify the resources server refused admission_closed (it never ran) parks at verify and is sent again; the agent is not run twice", async () => {
    const calls: string[] = [];
    vi.stubGlobal("fetch", async (url: string) => {
      const u = String(url);
      const op = u.slice(u.lastIndexOf("/") + 1);
      calls.push(op);
      const json = (body: unknown, status = 200) => new Response(JSON.stringify(body), { status });
      if (op === "seed_session") return json({});
      if (op === "open_session") return json({ session_key: "r1", restored: false });
      if (op === "activate") return json({ answer: "2", model_calls: 1, continued: false });
      if (op === "verify" && calls.filter((c) => c === "verify").length === 1) return json({ error: { code: "admission_closed", detail: "a checkpoint is open" } }, 409);
      if (op === "verify") return json({ reward: 1 });
      return json({}); // close_session
    });
    const kind = new EnvironmentKind();
    const episode = { rollout_id: "r1", attempt: 0 };
    const task = { expression: "1+1", tool_rounds: 1 };
    const result = await within(5000, kind.begin(episode, task, {}, (ep) => runGymEpisode({ agentUrl: "http://agent", resourcesUrl: "http://resources" }, ep, task)));
    expect(result).toMatchObject({ reward: 1, answer: "2" });
    expect(calls.filter((c) => c === "verify")).toHaveLength(2);
    expect(calls.filter((c) => c === "activate")).toHaveLength(1);
  });

  it.each([
    ["the agent's activate fails", "activate"],
    ["the verify fails (a bad task)", "verify"],
  ])("an episode that fails before its verify ended its resources session closes it there (%s), with its cookie", async (_why, failing) => {
    const calls: { op: string; cookie: string | null }[] = [];
    vi.stubGlobal("fetch", async (url: string, init: { headers?: Record<string, string> }) => {
      const op = String(url).slice(String(url).lastIndexOf("/") + 1);
      const host = new URL(String(url)).host;
      calls.push({ op: `${host}:${op}`, cookie: init.headers?.cookie ?? null });
      if (op === failing) return new Response(JSON.stringify({ error: { code: "invalid_request", detail: "scripted" } }), { status: 400 });
      if (op === "seed_session") return new Response("{}", { status: 200, headers: { "set-cookie": "ng_session=s-1; Path=/" } });
      if (op === "open_session") return new Response(JSON.stringify({ session_key: "r1", restored: false }), { status: 200 });
      if (op === "activate") return new Response(JSON.stringify({ answer: "2", model_calls: 1, continued: false }), { status: 200 });
      return new Response("{}", { status: 200 });
    });
    const kind = new EnvironmentKind();
    const episode = { rollout_id: "r1", attempt: 0 };
    const task = { expression: "1+1", tool_rounds: 1 };
    await expect(kind.begin(episode, task, {}, (ep) => runGymEpisode({ agentUrl: "http://agent", resourcesUrl: "http://resources" }, ep, task))).rejects.toMatchObject({ code: "invalid_request" });
    expect(calls.filter((c) => c.op.endsWith("close_session"))).toEqual([
      { op: "agent:close_session", cookie: null },
      { op: "resources:close_session", cookie: "ng_session=s-1" },
    ]);
  });

  it("a successful episode leaves its resources session to its verify (no close_session there)", async () => {
    const ops: string[] = [];
    vi.stubGlobal("fetch", async (url: string) => {
      const u = new URL(String(url));
      ops.push(`${u.host}:${u.pathname.slice(u.pathname.lastIndexOf("/") + 1)}`);
      if (u.pathname.endsWith("/activate")) return new Response(JSON.stringify({ answer: "2", model_calls: 1, continued: false }), { status: 200 });
      if (u.pathname.endsWith("/verify")) return new Response(JSON.stringify({ reward: 1 }), { status: 200 });
      return new Response("{}", { status: 200 });
    });
    const kind = new EnvironmentKind();
    const task = { expression: "1+1", tool_rounds: 1 };
    await kind.begin({ rollout_id: "r2", attempt: 0 }, task, {}, (ep) => runGymEpisode({ agentUrl: "http://agent", resourcesUrl: "http://resources" }, ep, task));
    expect(ops.filter((op) => op.endsWith("close_session"))).toEqual(["agent:close_session"]);
  });

  it("a failed episode's resources close_session the resources server parks through a long checkpoint waits for its resume (the bound counts outside checkpoints) and ends the session", async () => {
    const world = await resourcesWorld();
    try {
      const resources = await world.harness(new CalculatorServer());
      const resourcesUrl = await resources.app.listen({ host: "127.0.0.1", port: 0 });
      let failActivate!: () => void;
      const activateFails = new Promise<void>((resolve) => (failActivate = resolve));
      let activating!: () => void;
      const activated = new Promise<void>((resolve) => (activating = resolve));
      const realFetch = globalThis.fetch;
      // The agent is a stub whose activate fails on cue; the resources server is the real one.
      vi.stubGlobal("fetch", async (url: string, init: RequestInit) => {
        const u = String(url);
        if (u.startsWith(resourcesUrl)) return realFetch(url, init);
        if (u.endsWith("/activate")) {
          activating();
          await activateFails;
          return new Response(JSON.stringify({ error: { code: "internal_error", detail: "scripted" } }), { status: 500 });
        }
        return new Response(JSON.stringify({ session_key: "r1", restored: false }), { status: 200 });
      });
      const env = new EnvironmentKind();
      const task = { expression: "1+1", tool_rounds: 1 };
      const run = env.begin({ rollout_id: "r1", attempt: 0 }, task, {}, (ep) =>
        runGymEpisode({ agentUrl: "http://agent", resourcesUrl }, ep, task, { closeSessionTimeoutMs: 50 }),
      );
      const outcome = run.then(
        () => "ok",
        (error: unknown) => error,
      );
      await activated;
      expect(resources.kind.readiness().counts).toMatchObject({ sessions: 1 });
      // A checkpoint: the environment parks first, the resources server closes admission last.
      await env.closeAdmission();
      expect(await resources.call("prepare", { checkpoint_id: "c1" })).toMatchObject({ phase: "prepared" });
      failActivate();
      // The close is parked until resume, longer than its bound (50 ms here, 5 s in production).
      await waitUntil(() => (resources.kind.readiness().counts.waiting ?? 0) > 0, "the close parked at the resources server", 2000);
      expect(resources.kind.readiness().counts).toMatchObject({ waiting: 1 });
      // Time passing is what is tested: 300 ms closed, six times the bound, must not count.
      await new Promise((resolve) => setTimeout(resolve, 300));
      // Resume: resources first, the environment last.
      await resources.call("resume", { checkpoint_id: "c1" });
      await env.openAdmission();
      expect(await within(2000, outcome)).toMatchObject({ code: "internal_error" });
      expect(resources.kind.readiness().counts).toMatchObject({ sessions: 0, waiting: 0 });
    } finally {
      await world.close();
    }
  });

  it("a failed episode's resources close_session that never answers gives up after its bound outside checkpoints, and says so in the log", async () => {
    const lines: Record<string, unknown>[] = [];
    const logger = pino({ level: "warn" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
    vi.stubGlobal("fetch", async (url: string, init: { signal?: AbortSignal }) => {
      const op = String(url).slice(String(url).lastIndexOf("/") + 1);
      if (op === "activate") return new Response(JSON.stringify({ error: { code: "internal_error", detail: "scripted" } }), { status: 500 });
      if (op === "seed_session") return new Response("{}", { status: 200, headers: { "set-cookie": "ng_session=s-1; Path=/" } });
      if (op === "open_session" || String(url).startsWith("http://agent")) return new Response(JSON.stringify({ session_key: "r1", restored: false }), { status: 200 });
      // The resources server's close_session: never answered.
      return new Promise<Response>((_, reject) => init.signal?.addEventListener("abort", () => reject(init.signal!.reason)));
    });
    const env = new EnvironmentKind();
    const task = { expression: "1+1", tool_rounds: 1 };
    const run = env.begin({ rollout_id: "r1", attempt: 0 }, task, {}, (ep) =>
      runGymEpisode({ agentUrl: "http://agent", resourcesUrl: "http://resources" }, ep, task, { closeSessionTimeoutMs: 50, logger }),
    );
    await expect(within(2000, run)).rejects.toMatchObject({ code: "internal_error" });
    expect(lines).toEqual([expect.objectContaining({ level: 40, episode: "r1", msg: expect.stringContaining("resources session") })]);
  });

  it("a session seeded by a step the episode then fails in (its deadline ran out as the restart_only seed replied) is closed with its cookie", async () => {
    const resourcesCalls: { op: string; cookie: string | null }[] = [];
    vi.stubGlobal("fetch", async (url: string, init: { signal?: AbortSignal; headers?: Record<string, string> }) => {
      const u = String(url);
      const op = u.slice(u.lastIndexOf("/") + 1);
      if (u.startsWith("http://agent")) return new Response("{}", { status: 200 });
      resourcesCalls.push({ op, cookie: init.headers?.cookie ?? null });
      if (op === "seed_session") {
        // The resources server opened the session; its reply arrives just as the deadline fires.
        await new Promise((resolve) => init.signal?.addEventListener("abort", resolve, { once: true }));
        return new Response("{}", { status: 200, headers: { "set-cookie": "ng_session=s-7; Path=/", "x-ng-checkpoint-restart": "1" } });
      }
      return new Response("{}", { status: 200 }); // close_session
    });
    const env = new EnvironmentKind();
    const task = { expression: "1+1", tool_rounds: 1 };
    const run = env.begin({ rollout_id: "r1", attempt: 0 }, task, { timeoutMs: 20 }, (ep) =>
      runGymEpisode({ agentUrl: "http://agent", resourcesUrl: "http://resources" }, ep, task, { closeSessionTimeoutMs: 1000 }),
    );
    await expect(within(2000, run)).rejects.toMatchObject({ code: "deadline_exceeded" });
    expect(resourcesCalls).toEqual([
      { op: "seed_session", cookie: null },
      { op: "close_session", cookie: "ng_session=s-7" },
    ]);
  });
});
