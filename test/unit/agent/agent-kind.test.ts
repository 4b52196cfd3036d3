import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointError, type EpisodeId, type PhaseOp, type RequestInputOf } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { AgentKind, type Activation, type AgentSessionHooks, type RestoredAgentSession } from "../../../participants/kinds/agent/index.js";
import { refusalCode } from "../../support/refusal.js";
import { ep } from "../../support/episode.js";
import { expectRetryAfter } from "../../support/park-retry.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";

const flush = () => new Promise((resolve) => setImmediate(resolve));

/** A latch a test opens when it wants work to go on. */
function latch() {
  let open!: () => void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
}

/** Bounded polling for a condition (no fixed sleeps). */
async function waitFor(condition: () => boolean, timeoutMs = 5000): Promise<void> {
  const until = Date.now() + timeoutMs;
  while (!condition()) {
    if (Date.now() > until) throw new Error("condition not reached");
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

let root: string;
const planes: ParticipantControlPlane[] = [];
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-agent-"));
});
afterEach(async () => {
  for (const plane of planes.splice(0)) plane.dispose();
  await rm(root, { recursive: true, force: true });
});

/** Hooks keeping `{cookie}` per session; restore validates every entry before installing any. */
class CookieHooks implements AgentSessionHooks {
  readonly state = new Map<string, { cookie: string }>();
  readonly retired: string[] = [];
  async exportAgentSessions(keys: string[]) {
    return Object.fromEntries(keys.map((k) => [k, this.state.get(k) ?? { cookie: "none" }]));
  }
  async restoreAgentSessions(sessions: RestoredAgentSession[]) {
    for (const s of sessions) {
      const cookie = (s.session as { cookie?: unknown } | null)?.cookie;
      if (typeof cookie !== "string") throw new CheckpointError("invalid_checkpoint_state", `session ${s.session_key} has no cookie`);
    }
    for (const s of sessions) this.state.set(s.session_key, s.session as { cookie: string });
  }
  async retireAgentSession(key: string) {
    this.retired.push(key);
    this.state.delete(key);
  }
}

function fresh() {
  const hooks = new CookieHooks();
  const kind = new AgentKind(hooks);
  const plane = new ParticipantControlPlane({ adapter: kind, instance: "agent0", leaseGraceSeconds: 60, checkpointRoot: root });
  planes.push(plane as unknown as ParticipantControlPlane);
  const call = <O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) => {
    const request: Record<string, unknown> = { deadline_ts: Date.now() / 1000 + 30, epoch: 1, ...body };
    if (op === "commit") Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), episode_ids: null, stop: false, ...body });
    if (op === "commit" && !("checkpoint_dir" in body)) createCheckpointDir(root, body.checkpoint_id);
    if (op === "restore") Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), ...body });
    return plane.handle(op, request as never);
  };
  return { kind, hooks, plane, call };
}

/** `second`, a fresh process, restored checkpoint c1 of `first`'s sessions k1 and k2 (taken at their first boundary) and resumed. */
/**
 * Runs a legacy episode of `kind` to a boundary, then parks it in a replay step until aborted: the
 * episode a checkpoint captures (the run's own end is of no interest here).
 */
function parkInReplay(kind: ReturnType<typeof fresh>["kind"], episode: EpisodeId, task: Record<string, unknown>, boundary: Record<string, unknown> = { next: "loop" }): void {
  void kind
    .runLegacy(episode, task, {}, async (e) => {
      await e.boundary(boundary);
      await e.step("replay", (signal) => new Promise((_, reject) => signal.addEventListener("abort", () => reject(signal.reason))));
    })
    .catch(() => undefined);
}

async function restoredK1K2() {
  const first = fresh();
  const policy = new ScriptedPolicy();
  for (const id of ["k1", "k2"]) {
    first.kind.openSession(ep(id));
    first.hooks.state.set(id, { cookie: id });
    void first.kind.activate(ep(id), turnLoop(policy, { count: 0 })).catch(() => undefined);
  }
  await flush();
  await first.call("prepare", { checkpoint_id: "c1" });
  await first.call("commit", { checkpoint_id: "c1" });
  await first.call("resume", { checkpoint_id: "c1" });
  const second = fresh();
  await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("k1"), ep("k2")] });
  await second.call("resume", { checkpoint_id: "c1" });
  return { first, second };
}

const code = (work: () => unknown) => refusalCode(work);

/** A scripted policy: each call waits for the test to answer it. */
class ScriptedPolicy {
  readonly calls: { messages: number; answer: (reply: string | "refuse") => void }[] = [];
  call(messages: string[], signal: AbortSignal): Promise<string> {
    return new Promise((resolve, reject) => {
      signal.addEventListener("abort", () => reject(signal.reason), { once: true });
      this.calls.push({
        messages: messages.length,
        answer: (reply) => (reply === "refuse" ? reject(new CheckpointError("admission_closed", "policy parked")) : resolve(reply)),
      });
    });
  }
}

/** A turn loop: boundary before each model call, tool round; a final boundary holds the answer (as the reference loop's). */
function turnLoop(policy: ScriptedPolicy, snapshots: { count: number }) {
  return async (a: Activation) => {
    const restored = a.continuation();
    const messages = restored ? [...(restored.messages as string[])] : ["system", "user"];
    for (let round = 0; round < 5; round++) {
      const copy = [...messages];
      await a.boundary(() => {
        snapshots.count += 1;
        return { messages: copy };
      });
      let reply: string;
      for (;;) {
        try {
          reply = await a.awaitingModel(policy.call(messages, a.signal));
          break;
        } catch (error) {
          if (error instanceof CheckpointError && error.code === "admission_closed") {
            await a.park();
            continue;
          }
          throw error;
        }
      }
      if (!reply.startsWith("tool")) {
        const final = [...messages, "assistant"];
        await a.boundary(() => ({ messages: final, answer: reply }));
        return { answer: reply, messages: messages.length };
      }
      messages.push("assistant", "tool-result");
    }
    throw new Error("too many rounds");
  };
}

describe("agent participant", () => {
  it("activate's checkBoundary refuses a restored continuation before it is claimed: the session stays restored and idle, and a passing check hands it over", async () => {
    const { kind } = fresh();
    await kind.install([{ episode_id: ep("b"), mode: "session", session_key: "b", session: { cookie: "c" }, boundary: { messages: ["S0"] }, episode: null }]);
    kind.openSession(ep("b", 1));
    const refuse = () => {
      throw new CheckpointError("invalid_checkpoint_state", "not a boundary this loop continues from");
    };
    let ran = false;
    for (let i = 0; i < 2; i++) {
      expect(await code(() => kind.activate(ep("b", 1), async () => (ran = true), "b", { checkBoundary: refuse }))).toBe("invalid_checkpoint_state");
      expect({ ran, restoredPending: kind.sessions.restoredPending, state: kind.sessions.stateOf("b") }).toEqual({ ran: false, restoredPending: 1, state: "idle" });
    }
    expect(await kind.activate(ep("b", 1), async (a) => a.continuation(), "b", { checkBoundary: () => undefined })).toEqual({ messages: ["S0"] });
    expect(kind.sessions.restoredPending).toBe(0);
  });

  it("sessions are at a boundary while awaiting a policy call made right after one; snapshots run only on export", async () => {
    const { kind, call } = fresh();
    const policy = new ScriptedPolicy();
    const snapshots = { count: 0 };
    kind.openSession(ep("s1"));
    expect(kind.sessions.stateOf("s1")).toBe("idle");
    const run = kind.activate(ep("s1"), turnLoop(policy, snapshots));
    await flush();
    expect(kind.sessions.stateOf("s1")).toBe("at_boundary");
    policy.calls[0]!.answer("tool");
    await flush();
    expect(policy.calls.map((c) => c.messages)).toEqual([2, 4]);
    expect(snapshots.count).toBe(0);
    expect((await call("prepare", { checkpoint_id: "c1" })).phase).toBe("prepared");
    const commit = await call("commit", { checkpoint_id: "c1" });
    expect(commit.episode_ids).toEqual(["s1"]);
    expect(snapshots.count).toBe(1);
    await call("resume", { checkpoint_id: "c1" });
    policy.calls[1]!.answer("42");
    expect(await run).toEqual({ answer: "42", messages: 4 });
    expect(kind.sessions.stateOf("s1")).toBe("idle");
    // An idle session is exported at its activation's final boundary, never as "start over".
    expect((await kind.exportRecords([ep("s1")])).map((r) => r.boundary)).toEqual([{ messages: ["system", "user", "assistant", "tool-result", "assistant"], answer: "42" }]);
    await kind.closeSession(ep("s1"));
    expect(kind.hasLiveState()).toBe(false);
  });

  it("a running session blocks; a refused policy call parks it until resume, then retries from the same boundary", async () => {
    const { kind, call } = fresh();
    const policy = new ScriptedPolicy();
    kind.openSession(ep("p1"));
    const run = kind.activate(ep("p1"), async (a) => {
      // work between boundaries, until the test lets it reach its first boundary
      await waitFor(() => kind.sessions.gate.closed);
      return turnLoop(policy, { count: 0 })(a);
    });
    await flush();
    expect(kind.readiness().blockers).toEqual(["p1"]);
    const prepared = call("prepare", { checkpoint_id: "c1" });
    expect((await prepared).phase).toBe("prepared");
    // the activation started before admission closed: it parks at its first boundary
    expect(kind.sessions.stateOf("p1")).toBe("at_boundary");
    expect(policy.calls).toHaveLength(0);
    await call("resume", { checkpoint_id: "c1" });
    await flush();
    expect(policy.calls).toHaveLength(1);
    policy.calls[0]!.answer("refuse");
    await flush();
    expect(kind.sessions.stateOf("p1")).toBe("at_boundary");
    await waitFor(() => policy.calls.length === 2);
    expect(policy.calls.map((c) => c.messages)).toEqual([2, 2]);
    // the retried call is made from the same boundary: the session still counts as at it
    expect(kind.sessions.stateOf("p1")).toBe("at_boundary");
    expect(kind.readiness().blockers).toEqual([]);
    policy.calls[1]!.answer("done");
    expect((await run).answer).toBe("done");
  });

  it("a policy response delivered while admission is closed is not exported at the boundary before the call", async () => {
    // The model stage prepared after the response's stream ended; the agent's prepare closed
    // admission before its fetch resolved. The model exports that call as delivered.
    const first = fresh();
    first.kind.openSession(ep("d"));
    let respond!: (reply: string) => void;
    const response = new Promise<string>((resolve) => (respond = resolve));
    const toolRound = latch();
    const run = first.kind.activate(ep("d"), async (a) => {
      await a.boundary(() => ({ messages: ["S0"] }));
      const reply = await a.awaitingModel(response);
      await toolRound.promise;
      await a.boundary(() => ({ messages: ["S0", reply] }));
      return reply;
    });
    await flush();
    expect(first.kind.sessions.stateOf("d")).toBe("at_boundary");
    expect((await first.call("prepare", { checkpoint_id: "c1" })).phase).toBe("prepared");
    respond("S1");
    await flush();
    // Between boundaries again: the commit refuses rather than export S0 (which would repeat the call).
    expect(await code(() => first.call("commit", { checkpoint_id: "c1" }))).toBe("invalid_phase");
    expect(first.kind.readiness().blockers).toEqual(["d"]);
    // It runs on (its callees close after the agent) to its next boundary and parks there.
    toolRound.open();
    await waitFor(() => first.kind.sessions.stateOf("d") === "at_boundary");
    expect((await first.call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual(["d"]);

    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("d")] });
    await second.call("resume", { checkpoint_id: "c1" });
    second.kind.openSession(ep("d", 1));
    expect(await second.kind.activate(ep("d", 1), async (a) => a.continuation())).toEqual({ messages: ["S0", "S1"] });
    await first.call("resume", { checkpoint_id: "c1" });
    expect(await run).toBe("S1");
  });

  it("after a delivered policy call, parking without a new boundary blocks instead of exporting the stale one", async () => {
    const { kind } = fresh();
    kind.openSession(ep("q"));
    let refuse!: (error: Error) => void;
    const run = kind.activate(ep("q"), async (a) => {
      await a.boundary(() => ({ messages: ["S0"] }));
      await a.awaitingModel(Promise.resolve("tool"));
      // a second policy call without reporting a boundary first, refused by a parked policy
      try {
        await a.awaitingModel(new Promise((_, reject) => (refuse = reject)));
      } catch {
        await a.park();
      }
      return "done";
    });
    await flush();
    refuse(new CheckpointError("admission_closed", "policy parked"));
    await flush();
    expect(kind.sessions.stateOf("q")).toBe("running");
    expect(kind.readiness().blockers).toEqual(["q"]);
    expect(kind.sessions.exportable(null)).toEqual([]);
    expect(await run).toBe("done");
  });

  it("an activation ending after a delivered policy call without a boundary makes its session a restart, never exported at the stale boundary", async () => {
    const { kind, call } = fresh();
    kind.openSession(ep("e"));
    expect(
      await kind.activate(ep("e"), async (a) => {
        await a.boundary(() => ({ messages: ["S0"] }));
        return a.awaitingModel(Promise.resolve("final answer")); // no boundary reported after it
      }),
    ).toBe("final answer");
    expect(kind.sessions.stateOf("e")).toBe("idle");
    expect(kind.readiness()).toMatchObject({ blockers: [], restarts: ["e"] });
    const prepared = await call("prepare", { checkpoint_id: "c1" });
    expect(prepared.report.restarts).toEqual(["e"]);
    expect(await code(() => call("commit", { checkpoint_id: "c1", episode_ids: [ep("e")] }))).toBe("restart_in_scope");
    expect((await call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual([]);
    await call("resume", { checkpoint_id: "c1" });
    // a later activation that reports a boundary makes it continuable again
    await kind.activate(ep("e"), async (a) => a.boundary(() => ({ messages: ["S0", "final answer", "S2"] })));
    expect(kind.readiness().restarts).toEqual([]);
    expect((await kind.exportRecords(null)).map((r) => r.boundary)).toEqual([{ messages: ["S0", "final answer", "S2"] }]);
  });

  it("one ending that way while a checkpoint is open blocks until resume (the restart set is fixed at prepare), then is a restart", async () => {
    const { kind, call } = fresh();
    kind.openSession(ep("f"));
    let respond!: (reply: string) => void;
    const ending = latch();
    const run = kind.activate(ep("f"), async (a) => {
      await a.boundary(() => ({ messages: ["S0"] }));
      const reply = await a.awaitingModel(new Promise<string>((resolve) => (respond = resolve)));
      await ending.promise;
      return reply;
    });
    await flush();
    expect((await call("prepare", { checkpoint_id: "c1" })).report.restarts).toEqual([]);
    respond("S1");
    ending.open();
    expect(await run).toBe("S1");
    expect(kind.sessions.stateOf("f")).toBe("running");
    expect(kind.readiness()).toMatchObject({ blockers: ["f"], restarts: [] });
    expect(kind.sessions.exportable(null)).toEqual([]);
    expect(await code(() => call("commit", { checkpoint_id: "c1" }))).toBe("invalid_phase");
    await call("resume", { checkpoint_id: "c1" });
    expect(kind.sessions.stateOf("f")).toBe("idle");
    expect(kind.readiness()).toMatchObject({ blockers: [], restarts: ["f"] });
  });

  it("open_session: refused while closed, stale_attempt for another attempt; restored sessions re-bound by the next attempt continue once", async () => {
    const first = fresh();
    const policy = new ScriptedPolicy();
    first.kind.openSession(ep("r"));
    first.hooks.state.set("r", { cookie: "c-r" });
    const run = first.kind.activate(ep("r"), turnLoop(policy, { count: 0 }));
    void run.catch(() => undefined);
    await flush();
    policy.calls[0]!.answer("tool");
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    expect(await code(() => first.kind.openSession(ep("other")))).toBe("admission_closed");
    expect(await code(() => first.kind.openSession(ep("r", 1)))).toBe("stale_attempt");
    await first.call("commit", { checkpoint_id: "c1" });

    const second = fresh();
    expect(await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("r")] })).toMatchObject({ restored: ["r-a1"] });
    expect(second.hooks.state.get("r")).toEqual({ cookie: "c-r" });
    await second.call("resume", { checkpoint_id: "c1" });
    expect(await code(() => second.kind.openSession(ep("r")))).toBe("stale_attempt");
    expect(second.kind.openSession(ep("r", 1))).toEqual({ restored: true });
    const policy2 = new ScriptedPolicy();
    const resumed = second.kind.activate(ep("r", 1), turnLoop(policy2, { count: 0 }));
    await flush();
    expect(policy2.calls.map((c) => c.messages)).toEqual([4]);
    policy2.calls[0]!.answer("42");
    expect(await resumed).toEqual({ answer: "42", messages: 4 });
    expect(second.kind.openSession(ep("r", 1))).toEqual({ restored: false });
    await first.kind.retire([ep("r")]);
  });

  // Reference §4.1: record lines keep the exporter's key order; a restored session sees its state and
  // boundary exactly as exported (an agent renders stored dicts back to the model).
  it("a restored session and its boundary keep the exporter's key order", async () => {
    const snapshot = { messages: [{ role: "user", content: "hi" }], zeta: { b: 1, a: 2 }, alpha: 0 };
    const session = { cookie: "c-o", turns: { z: 1, y: [{ d: 1, c: 2 }] }, a: null };
    const first = fresh();
    first.kind.openSession(ep("o"));
    (first.hooks.state as Map<string, unknown>).set("o", session);
    void first.kind
      .activate(ep("o"), async (a) => {
        await a.boundary(() => snapshot);
        await a.park();
        return {};
      })
      .catch(() => undefined);
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    await first.call("commit", { checkpoint_id: "c1" });
    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("o")] });
    expect(JSON.stringify(second.hooks.state.get("o"))).toBe(JSON.stringify(session));
    await second.call("resume", { checkpoint_id: "c1" });
    second.kind.openSession(ep("o", 1));
    let continued: unknown;
    await second.kind.activate(ep("o", 1), async (a) => {
      continued = a.continuation();
      return {};
    });
    expect(JSON.stringify(continued)).toBe(JSON.stringify(snapshot));
    await first.call("resume", { checkpoint_id: "c1" });
    await first.kind.retire([ep("o")]);
  });

  it("a session opened under its own key (not the rollout id) is restored under that key and re-bound by the next attempt", async () => {
    const first = fresh();
    first.kind.openSession(ep("r"), "sess.r");
    first.hooks.state.set("sess.r", { cookie: "c-r" });
    void first.kind.activate(ep("r"), turnLoop(new ScriptedPolicy(), { count: 0 }), "sess.r").catch(() => undefined);
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    expect((await first.call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual(["r"]);
    await first.call("resume", { checkpoint_id: "c1" });

    // The checkpoint took it, so its restore must install it (it used to refuse the whole restore).
    const second = fresh();
    expect(await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("r")] })).toMatchObject({ restored: ["r-a1"] });
    expect(second.hooks.state.get("sess.r")).toEqual({ cookie: "c-r" });
    await second.call("resume", { checkpoint_id: "c1" });
    expect(second.kind.openSession(ep("r", 1), "sess.r")).toEqual({ restored: true });
    expect(await second.kind.activate(ep("r", 1), async (a) => a.continuation(), "sess.r")).toEqual({ messages: ["system", "user"] });
    await first.kind.retire([ep("r")]);
  });

  it("a session key no record can hold is refused at open_session (invalid_request), not by every later commit", async () => {
    const { kind, call } = fresh();
    for (const key of ["has space", "a/b", ".dot", "k".repeat(201)]) {
      expect(await code(() => kind.openSession(ep("r"), key))).toBe("invalid_request");
    }
    expect(kind.sessions.size).toBe(0);
    await call("prepare", { checkpoint_id: "c1" });
    expect((await call("commit", { checkpoint_id: "c1" })).phase).toBe("committed");
    await call("resume", { checkpoint_id: "c1" });
  });

  it("restore refuses a session or legacy record whose next attempt was retired here: stale_attempt, no hook called, nothing installed", async () => {
    const first = fresh();
    first.kind.openSession(ep("s"));
    first.hooks.state.set("s", { cookie: "c-s" });
    void first.kind.activate(ep("s"), turnLoop(new ScriptedPolicy(), { count: 0 })).catch(() => undefined);
    parkInReplay(first.kind, ep("L"), { expression: "1" });
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    await first.call("commit", { checkpoint_id: "c1" });
    await first.call("resume", { checkpoint_id: "c1" });
    for (const retired of ["s", "L"]) {
      const second = fresh();
      let restoreHookCalled = false;
      second.hooks.restoreAgentSessions = async () => void (restoreHookCalled = true);
      await second.call("retire", { checkpoint_id: "retire", episode_ids: [ep(retired, 1)] });
      expect(await code(() => second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("s"), ep("L")] }))).toBe("stale_attempt");
      expect(restoreHookCalled).toBe(false);
      expect(second.kind.hasLiveState()).toBe(false);
      expect(second.plane.currentPhase).toBe("idle");
    }
    await first.kind.retire([ep("s"), ep("L")]);
  });

  it("a second activate of a session whose activation still runs is refused (invalid_request) and changes nothing: retire still stops the first", async () => {
    const { kind, call } = fresh();
    kind.openSession(ep("a"));
    const policy = new ScriptedPolicy();
    const first = kind.activate(ep("a"), turnLoop(policy, { count: 0 }));
    const outcome = first.catch((error: unknown) => error);
    await flush();
    let ran = false;
    expect(await code(() => kind.activate(ep("a"), async () => (ran = true)))).toBe("invalid_request");
    expect(ran).toBe(false);
    expect(kind.sessions.stateOf("a")).toBe("at_boundary");
    await call("retire", { checkpoint_id: "retire", episode_ids: [ep("a")] });
    expect(await outcome).toMatchObject({ code: "stale_attempt" });
    expect(kind.hasLiveState()).toBe(false);
  });

  it("a restore fences its source attempts: legacy /run and open_session of them are refused, with or without a record here", async () => {
    const first = fresh();
    first.kind.openSession(ep("s"));
    first.hooks.state.set("s", { cookie: "c-s" });
    void first.kind.activate(ep("s"), turnLoop(new ScriptedPolicy(), { count: 0 })).catch(() => undefined);
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    await first.call("commit", { checkpoint_id: "c1" });
    // "env-only" is in scope but has no agent record: it continues as env-only@1 all the same.
    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("s"), ep("env-only")] });
    await second.call("resume", { checkpoint_id: "c1" });
    const fromInput = async () => "ran from input";
    expect(await code(() => second.kind.runLegacy(ep("s"), { expression: "1" }, {}, fromInput))).toBe("stale_attempt");
    expect(await code(() => second.kind.runLegacy(ep("env-only"), { expression: "1" }, {}, fromInput))).toBe("stale_attempt");
    expect(await code(() => second.kind.openSession(ep("env-only")))).toBe("stale_attempt");
    expect(second.kind.openSession(ep("env-only", 1))).toEqual({ restored: false });
    expect(second.kind.openSession(ep("s", 1))).toEqual({ restored: true });
    await first.call("resume", { checkpoint_id: "c1" });
    await first.kind.retire([ep("s")]);
  });

  it("restore is validated and all-or-nothing; retire cancels the activation, frees the session and fences the attempt", async () => {
    const first = fresh();
    const policy = new ScriptedPolicy();
    for (const id of ["a", "b"]) {
      first.kind.openSession(ep(id));
      void first.kind.activate(ep(id), turnLoop(policy, { count: 0 })).catch(() => undefined);
    }
    first.hooks.state.set("a", { cookie: "ok" });
    first.hooks.state.set("b", { bad: true } as never);
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    await first.call("commit", { checkpoint_id: "c1" });
    await first.call("resume", { checkpoint_id: "c1" });

    const second = fresh();
    expect(await code(() => second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("a"), ep("b")] }))).toBe("invalid_checkpoint_state");
    expect(second.kind.hasLiveState()).toBe(false);
    expect(second.hooks.state.size).toBe(0);
    expect(second.plane.currentPhase).toBe("idle");

    await first.call("retire", { checkpoint_id: "retire", episode_ids: [ep("a"), ep("b")] });
    expect(first.kind.hasLiveState()).toBe(false);
    expect(first.hooks.retired.sort()).toEqual(["a", "b"]);
    expect(await code(() => first.kind.openSession(ep("a")))).toBe("stale_attempt");
    expect(await code(() => first.kind.activate(ep("a"), async () => 1))).toBe("stale_attempt");
    expect(first.plane.status().retired_rollouts).toBe(2);
  });

  it("a session whose retire was cut short by its deadline blocks prepare and is never exported, until a retried retire drops it", async () => {
    const { kind, hooks, plane, call } = fresh();
    kind.openSession(ep("r1"));
    // The activation awaits a call that ignores the abort signal (a user's agent, a long generation): the retire waits for it.
    const answer = latch();
    const activation = kind
      .activate(ep("r1"), async (a) => {
        await a.boundary(() => ({ turn: 1 }));
        return a.awaitingModel(answer.promise);
      })
      .catch(() => undefined);
    await waitFor(() => kind.sessions.stateOf("r1") === "at_boundary");
    expect(await code(() => call("retire", { checkpoint_id: "retire", deadline_ts: Date.now() / 1000 + 0.2, episode_ids: [ep("r1")] }))).toBe(
      "deadline_exceeded",
    );
    // Still parked at its boundary, but being retired: a blocker, whatever its state (protocol §9).
    expect(kind.sessions.stateOf("r1")).toBe("at_boundary");
    const prepared = await call("prepare", { checkpoint_id: "c1", deadline_ts: Date.now() / 1000 + 0.3 });
    expect(prepared.phase).toBe("preparing");
    expect(prepared.report.blockers).toEqual(["r1"]);
    expect(await kind.exportRecords(null)).toEqual([]);
    await call("resume", { checkpoint_id: "c1" });

    answer.open();
    await activation;
    await call("retire", { checkpoint_id: "retire", episode_ids: [ep("r1")] });
    expect(kind.hasLiveState()).toBe(false);
    // The cut-short retire, finishing in the background, and the retried one may both free it (the hook tolerates that).
    expect([...new Set(hooks.retired)]).toEqual(["r1"]);
    expect(plane.adapter.readiness().blockers).toEqual([]);
  });

  it("legacy /run episodes use the step tracker and are exported with their own boundary", async () => {
    const first = fresh();
    const task = { expression: "2 + 2" };
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const run = first.kind.runLegacy(ep("L"), task, {}, async (e) => {
      const b = e.continuation() ?? { next: "loop", messages: 2 };
      await e.boundary(b);
      await e.step("replay", async () => gate);
      await e.boundary({ next: "return", reward: 1 });
      return 1;
    });
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    const commit = await first.call("commit", { checkpoint_id: "c1" });
    expect(commit.episode_ids).toEqual(["L"]);
    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("L")] });
    await second.call("resume", { checkpoint_id: "c1" });
    expect(second.kind.statusExtras()).toMatchObject({ restored_pending: 1, legacy_episodes: 0 });
    const seen: unknown[] = [];
    expect(await second.kind.runLegacy(ep("L", 1), task, {}, async (e) => (seen.push(e.continuation()), 7))).toBe(7);
    expect(seen).toEqual([{ next: "loop", messages: 2 }]);
    await first.call("resume", { checkpoint_id: "c1" });
    release();
    expect(await run).toBe(1);
  });

  it("restore needs a fresh process: a pending legacy record counts as live state", async () => {
    const first = fresh();
    parkInReplay(first.kind, ep("P"), { expression: "1" });
    await flush();
    for (const c of ["c1", "c2"]) {
      await first.call("prepare", { checkpoint_id: c });
      await first.call("commit", { checkpoint_id: c });
      await first.call("resume", { checkpoint_id: c });
    }
    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("P")] });
    await second.call("resume", { checkpoint_id: "c1" });
    expect(second.kind.hasLiveState()).toBe(true); // checked before any hook runs
    expect(await code(() => second.call("restore", { checkpoint_id: "c2", episode_ids: [ep("P")] }))).toBe("invalid_checkpoint_state");
    expect(second.plane.currentPhase).toBe("idle");
    expect(second.kind.legacy.pendingKeys()).toEqual(["P-a1"]);
    await first.kind.retire([ep("P")]);
  });

  it("legacy: a model step whose response arrives while admission is closed is not exported at the boundary before it", async () => {
    const first = fresh();
    const task = { expression: "2 + 2" };
    let respond!: (reply: string) => void;
    const response = new Promise<string>((resolve) => (respond = resolve));
    const tool = latch();
    const run = first.kind.runLegacy(ep("LM"), task, {}, async (e) => {
      await e.boundary({ next: "loop", messages: 2 });
      await e.step("model", () => response);
      await e.step("wait", () => tool.promise); // the reply's tool round, as in the reference loop
      await e.boundary({ next: "loop", messages: 4 });
      return 1;
    });
    await flush();
    // While the call runs the episode is at the boundary before it (a held response never blocks).
    expect((await first.call("prepare", { checkpoint_id: "c1" })).phase).toBe("prepared");
    respond("tool");
    await flush();
    expect(await code(() => first.call("commit", { checkpoint_id: "c1" }))).toBe("invalid_phase");
    expect(first.kind.readiness().blockers).toEqual(["LM"]);
    tool.open();
    await waitFor(() => first.kind.legacy.steps.states().parked === 1);
    expect((await first.call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual(["LM"]);

    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("LM")] });
    await second.call("resume", { checkpoint_id: "c1" });
    expect(await second.kind.runLegacy(ep("LM", 1), task, {}, async (e) => e.continuation())).toEqual({ next: "loop", messages: 4 });
    await first.call("resume", { checkpoint_id: "c1" });
    expect(await run).toBe(1);
  });

  it("a restored session whose activation fails before its first boundary is claimed, not held: idle, no blocker, exported at its restored boundary, freed by its close", async () => {
    const { first, second } = await restoredK1K2();
    second.kind.openSession(ep("k1", 1));
    const crash = new Error("seeding the turn loop failed");
    await expect(
      second.kind.activate(ep("k1", 1), async (a) => {
        a.continuation();
        throw crash;
      }),
    ).rejects.toBe(crash);
    // Only k2 is still waiting for its replacement; k1 blocks nothing and still continues from where it was restored.
    expect(second.kind.readiness()).toMatchObject({ blockers: [], restarts: [], counts: { restored_pending: 1, idle: 2 } });
    await second.call("prepare", { checkpoint_id: "c2" });
    expect((await second.call("commit", { checkpoint_id: "c2" })).episode_ids).toEqual(["k1-a1", "k2-a1"]);
    await second.call("resume", { checkpoint_id: "c2" });
    // The environment's clean-up of its failed episode frees it.
    await second.kind.closeSession(ep("k1", 1));
    expect({ retired: second.hooks.retired, sessions: second.kind.statusExtras() }).toMatchObject({ retired: ["k1"], sessions: { sessions: 1, restored_pending: 1 } });
    await first.kind.retire([ep("k1"), ep("k2")]);
  });

  it("a commit fails when the hooks do not export every session; scope clean-up frees unclaimed restored sessions", async () => {
    const { first, second } = await restoredK1K2();
    await second.call("prepare", { checkpoint_id: "c2" });
    const commit = await second.call("commit", { checkpoint_id: "c2", episode_ids: [ep("k2", 1)] });
    expect(commit.episode_ids).toEqual(["k2-a1"]);
    expect(second.hooks.retired).toEqual(["k1"]);
    expect(second.kind.statusExtras()).toMatchObject({ sessions: 1, restored_pending: 1 });
    await second.call("resume", { checkpoint_id: "c2" });

    const exporter = second.hooks.exportAgentSessions.bind(second.hooks);
    second.hooks.exportAgentSessions = async (keys: string[]) => {
      const all = await exporter(keys);
      delete all[keys[0]!];
      return all;
    };
    await second.call("prepare", { checkpoint_id: "c3" });
    expect(await code(() => second.call("commit", { checkpoint_id: "c3", episode_ids: [ep("k2", 1)] }))).toBe("internal_error");
    await second.call("resume", { checkpoint_id: "c3" });
    await first.kind.retire([ep("k1"), ep("k2")]);
  });

  it("a session named like an Object.prototype member (constructor, toString) must be exported too: hooks that leave it out fail the commit", async () => {
    // Valid rollout ids; `key in states` found the inherited member, so the commit went through
    // with the session's state lost.
    for (const id of ["constructor", "toString"]) {
      const { kind, hooks, call } = fresh();
      kind.openSession(ep(id));
      hooks.exportAgentSessions = async () => ({});
      await call("prepare", { checkpoint_id: `c-${id}` });
      expect(await code(() => call("commit", { checkpoint_id: `c-${id}` }))).toBe("internal_error");
      await call("resume", { checkpoint_id: `c-${id}` });
    }
  });

  it("a legacy replacement with another task is refused and the restored episode is kept", async () => {
    const first = fresh();
    parkInReplay(first.kind, ep("T"), { expression: "1 + 1" });
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    await first.call("commit", { checkpoint_id: "c1" });
    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("T")] });
    await second.call("resume", { checkpoint_id: "c1" });
    expect(await code(() => second.kind.runLegacy(ep("T", 1), { expression: "2 + 2" }, {}, async () => 0))).toBe("invalid_request");
    expect(second.kind.statusExtras()).toMatchObject({ restored_pending: 1 });
    expect(await second.kind.runLegacy(ep("T", 1), { expression: "1 + 1" }, {}, async (e) => e.continuation())).toEqual({ next: "loop" });
    await first.call("resume", { checkpoint_id: "c1" });
    await first.kind.retire([ep("T")]);
  });
  it("a commit's clean-up holds the restored sessions it frees until each is freed: the key is refused admission_closed meanwhile, then opens with none of the old state", async () => {
    const { first, second } = await restoredK1K2();
    const gate = latch();
    const retireHook = second.hooks.retireAgentSession.bind(second.hooks);
    second.hooks.retireAgentSession = async (key: string) => {
      if (key === "k1") await gate.promise;
      await retireHook(key);
    };
    await second.call("prepare", { checkpoint_id: "c2" });
    // k1's hook outlives the commit's deadline: the commit answers, and the resume reopens admission
    // while the clean-up still runs.
    await second.call("commit", { checkpoint_id: "c2", episode_ids: [], deadline_ts: Date.now() / 1000 + 0.3 });
    await second.call("resume", { checkpoint_id: "c2" });
    // The controller starts k2 over (the attempt the restore installed, not fenced) while k2's
    // restored state is not freed yet: refused, retryable, changing nothing (it used to open over
    // that state, whose free was then skipped, so the new session inherited the restored cookie).
    expect(await code(() => second.kind.openSession(ep("k2", 1)))).toBe("admission_closed");
    expect(second.kind.sessions.stateOf("k2")).toBe("idle");
    expect(second.kind.statusExtras()).toMatchObject({ sessions: 2, restored_pending: 0 });
    expect(await second.kind.exportRecords(null)).toEqual([]);
    gate.open();
    await waitFor(() => second.kind.sessions.size === 0);
    expect(second.hooks.retired.sort()).toEqual(["k1", "k2"]);
    expect(second.kind.openSession(ep("k2", 1))).toEqual({ restored: false });
    expect(second.hooks.state.get("k2")).toBeUndefined();
    await first.kind.retire([ep("k1"), ep("k2")]);
  });
  it("a commit's clean-up drops left-out legacy records at once, not after the session frees: a slow free never lets the restarted attempt take the old record", async () => {
    const first = fresh();
    const task = { expression: "2 + 2" };
    first.kind.openSession(ep("k1"));
    first.hooks.state.set("k1", { cookie: "k1" });
    void first.kind.activate(ep("k1"), turnLoop(new ScriptedPolicy(), { count: 0 })).catch(() => undefined);
    parkInReplay(first.kind, ep("L"), task, { next: "loop", messages: 2 });
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    await first.call("commit", { checkpoint_id: "c1" });
    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("k1"), ep("L")] });
    await second.call("resume", { checkpoint_id: "c1" });
    const gate = latch();
    const retireHook = second.hooks.retireAgentSession.bind(second.hooks);
    second.hooks.retireAgentSession = async (key: string) => {
      await gate.promise;
      await retireHook(key);
    };
    await second.call("prepare", { checkpoint_id: "c2" });
    // k1's free outlives the commit's deadline; the commit answers and the checkpoint resumes.
    await second.call("commit", { checkpoint_id: "c2", episode_ids: [], deadline_ts: Date.now() / 1000 + 0.3 });
    await second.call("resume", { checkpoint_id: "c2" });
    // The controller starts L over from its input as the attempt the restore installed (not fenced).
    expect(second.kind.statusExtras()).toMatchObject({ restored_pending: 0 });
    expect(await second.kind.runLegacy(ep("L", 1), task, {}, async (e) => e.continuation())).toBeNull();
    gate.open();
    await waitFor(() => second.kind.sessions.size === 0);
    await first.call("resume", { checkpoint_id: "c1" });
    await first.kind.retire([ep("k1"), ep("L")]);
  });
  it("a commit's clean-up frees every left-out session past one whose free fails, and holds that one until a later clean-up frees it", async () => {
    const { first, second } = await restoredK1K2();
    let failures = 1;
    const retireHook = second.hooks.retireAgentSession.bind(second.hooks);
    second.hooks.retireAgentSession = async (key: string) => {
      if (key === "k1" && failures > 0) {
        failures -= 1;
        throw new Error("k1's state did not free");
      }
      await retireHook(key);
    };
    await second.call("prepare", { checkpoint_id: "c2" });
    // The clean-up is best effort: the commit answers committed all the same.
    expect((await second.call("commit", { checkpoint_id: "c2", episode_ids: [] })).phase).toBe("committed");
    await second.call("resume", { checkpoint_id: "c2" });
    // k2 was freed although k1's free failed first (the loop used to stop there, k2 never freed).
    expect(second.hooks.retired).toEqual(["k2"]);
    expect(second.kind.sessions.stateOf("k2")).toBeUndefined();
    // k1 is held, not leaked: refused (retryable), neither a blocker nor exported.
    expect(await code(() => second.kind.openSession(ep("k1", 1)))).toBe("admission_closed");
    expect(second.hooks.state.get("k1")).toEqual({ cookie: "k1" });
    expect(second.kind.readiness().blockers).toEqual([]);
    // The next commit's clean-up frees it again, whatever its scope.
    await second.call("prepare", { checkpoint_id: "c3" });
    expect(await second.kind.exportRecords(null)).toEqual([]);
    await second.call("commit", { checkpoint_id: "c3" });
    await second.call("resume", { checkpoint_id: "c3" });
    expect(second.hooks.retired).toEqual(["k2", "k1"]);
    expect(second.kind.hasLiveState()).toBe(false);
    expect(second.kind.openSession(ep("k1", 1))).toEqual({ restored: false });
    expect(second.hooks.state.get("k1")).toBeUndefined();
    await first.kind.retire([ep("k1"), ep("k2")]);
  });
  it("the next attempt cannot reopen a session key while its retire is still finishing (admission_closed: retry, not yet another attempt); once freed and dropped, it opens a fresh one", async () => {
    const { kind, hooks, call } = fresh();
    kind.openSession(ep("r1"));
    hooks.state.set("r1", { cookie: "attempt0" });
    // A legacy episode that finishes only when the test says so keeps the retire waiting before the free.
    const stop = latch();
    const legacy = kind.runLegacy(ep("x"), { expression: "1" }, {}, async () => stop.promise);
    const retire = call("retire", { checkpoint_id: "retire", episode_ids: [ep("r1"), ep("x")] });
    await waitFor(() => kind.readiness().blockers.includes("r1"));
    // Still retiring (its state not freed yet): refused, changing nothing. The retired attempt is
    // over; the next one (dispatched as stale_attempt told its controller) is asked to retry.
    expect(await code(() => kind.openSession(ep("r1")))).toBe("stale_attempt");
    expect(await code(() => kind.activate(ep("r1"), async () => 1))).toBe("stale_attempt");
    expect(await code(() => kind.openSession(ep("r1", 1)))).toBe("admission_closed");
    expect(await code(() => kind.activate(ep("r1", 1), async () => 1))).toBe("admission_closed");
    expect(await code(() => kind.openSession(ep("r2", 1), "r1"))).toBe("stale_attempt");
    expect(hooks.state.get("r1")).toEqual({ cookie: "attempt0" });
    stop.open();
    await legacy;
    await retire;
    expect(hooks.retired).toEqual(["r1"]);
    expect(kind.sessions.stateOf("r1")).toBeUndefined();
    expect(kind.openSession(ep("r1", 1))).toEqual({ restored: false });
    expect(hooks.state.get("r1")).toBeUndefined();
  });
  it("close_session frees a session's state before dropping it: one whose free fails stays held (not a blocker) until a retried close or a later commit frees it", async () => {
    const { kind, hooks, call } = fresh();
    kind.openSession(ep("c1"));
    hooks.state.set("c1", { cookie: "c1" });
    const gate = latch();
    let failures = 1;
    const retireHook = hooks.retireAgentSession.bind(hooks);
    hooks.retireAgentSession = async (key: string) => {
      await gate.promise;
      if (failures > 0) {
        failures -= 1;
        throw new Error("c1's state did not free");
      }
      await retireHook(key);
    };
    const closing = kind.closeSession(ep("c1"));
    await flush();
    // While its free runs, no attempt opens the key over the state being freed.
    expect(await code(() => kind.openSession(ep("c1")))).toBe("stale_attempt");
    gate.open();
    await expect(closing).rejects.toThrow("c1's state did not free");
    // Held, not leaked (it used to be dropped first, its state then untracked for good).
    expect(hooks.state.get("c1")).toEqual({ cookie: "c1" });
    expect(kind.statusExtras()).toMatchObject({ sessions: 1 });
    expect(kind.readiness().blockers).toEqual([]);
    expect(await kind.exportRecords(null)).toEqual([]);
    expect(await code(() => kind.openSession(ep("c1")))).toBe("stale_attempt");
    expect(await code(() => kind.openSession(ep("c1", 1)))).toBe("admission_closed");
    // A retried close frees it.
    await kind.closeSession(ep("c1"));
    expect(hooks.state.get("c1")).toBeUndefined();
    expect(kind.hasLiveState()).toBe(false);

    // Nobody retries a failed close (the environment ignores its failure): the next commit's clean-up frees it.
    kind.openSession(ep("c2"));
    hooks.state.set("c2", { cookie: "c2" });
    failures = 1;
    await expect(kind.closeSession(ep("c2"))).rejects.toThrow("did not free");
    await call("prepare", { checkpoint_id: "c-close" });
    await call("commit", { checkpoint_id: "c-close" });
    await call("resume", { checkpoint_id: "c-close" });
    expect(hooks.state.get("c2")).toBeUndefined();
    expect(kind.hasLiveState()).toBe(false);
    expect(kind.openSession(ep("c2", 1))).toEqual({ restored: false });
  });
  it("a restore install that outlived its deadline and whose later free fails is held like a failed install's state and freed again, not left blocking for good", async () => {
    const first = fresh();
    first.kind.openSession(ep("k1"));
    first.hooks.state.set("k1", { cookie: "k1" });
    await first.call("prepare", { checkpoint_id: "c1" });
    await first.call("commit", { checkpoint_id: "c1" });
    await first.call("resume", { checkpoint_id: "c1" });

    const second = fresh();
    const install = latch();
    const restoreHook = second.hooks.restoreAgentSessions.bind(second.hooks);
    second.hooks.restoreAgentSessions = async (sessions) => {
      await install.promise;
      await restoreHook(sessions);
    };
    let freeFails = true;
    let frees = 0;
    const retireHook = second.hooks.retireAgentSession.bind(second.hooks);
    second.hooks.retireAgentSession = async (key: string) => {
      frees += 1;
      if (freeFails) throw new Error("k1's state did not free");
      await retireHook(key);
    };
    const restore = { checkpoint_id: "c1", episode_ids: [ep("k1")] };
    expect(await code(() => second.call("restore", { ...restore, deadline_ts: Date.now() / 1000 + 0.2 }))).toBe("deadline_exceeded");
    // Its coordinator died before journaling the clean-up; the install ends meanwhile.
    install.open();
    // The install ends, and its background free fails: the session is held (a blocker).
    await waitFor(() => frees >= 1 && second.kind.readiness().blockers.includes("k1-a1"));
    expect(second.hooks.state.get("k1")).toEqual({ cookie: "k1" });
    // A successor re-driving the same restore gets its failure again, not "not fresh" (a refusal
    // that changed nothing), so its clean-up retires attempt+1 here.
    expect(await code(() => second.call("restore", restore))).toBe("deadline_exceeded");
    // And the free is tried again on its own: a clean-up that ran before the install ended (the
    // usual order) would not come back for it.
    freeFails = false;
    await waitFor(() => second.kind.readiness().blockers.length === 0, 10_000);
    expect(second.hooks.state.get("k1")).toBeUndefined();
    await second.call("retire", { checkpoint_id: "c1", episode_ids: [ep("k1", 1)] });
    await second.call("resume", { checkpoint_id: "c1" });
    expect(second.kind.hasLiveState()).toBe(false);
    expect(second.kind.openSession(ep("k1", 2))).toEqual({ restored: false });
  }, 20_000);
  it("a late restore install ending while a checkpoint opened meanwhile installs no legacy record of its fenced attempt+1, so that checkpoint's null scope cannot export it", async () => {
    const first = fresh();
    parkInReplay(first.kind, ep("P"), { expression: "1" });
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    expect((await first.call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual(["P"]);
    await first.call("resume", { checkpoint_id: "c1" });

    const second = fresh();
    const install = latch();
    let hookEnded = false;
    const restoreHook = second.hooks.restoreAgentSessions.bind(second.hooks);
    second.hooks.restoreAgentSessions = async (sessions) => {
      await install.promise;
      await restoreHook(sessions);
      hookEnded = true;
    };
    // The install outlives its deadline: P-a1 is fenced (the coordinator's clean-up retires it anyway).
    expect(await code(() => second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("P")], deadline_ts: Date.now() / 1000 + 0.2 }))).toBe("deadline_exceeded");
    await second.call("prepare", { checkpoint_id: "c2" });
    // It ends while c2 is open: the legacy install checks the fence again after the hook and refuses.
    install.open();
    await waitFor(() => hookEnded);
    for (let i = 0; i < 5; i++) await flush();
    expect(second.kind.legacy.pendingKeys()).toEqual([]);
    expect((await second.call("commit", { checkpoint_id: "c2" })).episode_ids).toEqual([]);
    await second.call("resume", { checkpoint_id: "c2" });
    await first.kind.retire([ep("P")]);
  }, 20_000);

  it("a commit's clean-up that outlived its commit never frees a newer session opened on a key a forget freed and dropped meanwhile", async () => {
    const { first, second } = await restoredK1K2();
    const gate = latch();
    let k1Frees = 0;
    const retireHook = second.hooks.retireAgentSession.bind(second.hooks);
    second.hooks.retireAgentSession = async (key: string) => {
      if (key === "k1" && k1Frees++ === 0) await gate.promise;
      await retireHook(key);
    };
    await second.call("prepare", { checkpoint_id: "c2" });
    // The clean-up (k1, then k2) hangs on k1 past the commit's deadline; the lock is free again.
    await second.call("commit", { checkpoint_id: "c2", episode_ids: [], deadline_ts: Date.now() / 1000 + 0.3 });
    await second.call("resume", { checkpoint_id: "c2" });
    // A forget frees and drops k2, and the rollout's next attempt opens k2 with state of its own.
    await second.call("forget", { checkpoint_id: "forget", rollout_ids: ["k2"] });
    expect(second.kind.sessions.stateOf("k2")).toBeUndefined();
    expect(second.kind.openSession(ep("k2", 1))).toEqual({ restored: false });
    second.hooks.state.set("k2", { cookie: "new" });
    gate.open();
    await waitFor(() => !second.kind.sessions.has("k1"));
    await flush();
    // The stale clean-up skips k2: another session has the key now (it used to free its cookie, then leave it).
    expect(second.hooks.state.get("k2")).toEqual({ cookie: "new" });
    expect(second.hooks.retired.filter((k) => k === "k2")).toEqual(["k2"]);
    expect(second.kind.sessions.stateOf("k2")).toBe("idle");
    await first.kind.retire([ep("k1"), ep("k2")]);
  });
  it("a retire that overran its deadline and keeps freeing never frees a newer session opened on a key a retried retire freed", async () => {
    const { kind, hooks, call } = fresh();
    for (const id of ["r1", "r2"]) {
      kind.openSession(ep(id));
      hooks.state.set(id, { cookie: id });
    }
    const gate = latch();
    let r1Frees = 0;
    const retireHook = hooks.retireAgentSession.bind(hooks);
    hooks.retireAgentSession = async (key: string) => {
      if (key === "r1" && r1Frees++ === 0) await gate.promise;
      await retireHook(key);
    };
    const episodes = [ep("r1"), ep("r2")];
    expect(await code(() => call("retire", { checkpoint_id: "retire", deadline_ts: Date.now() / 1000 + 0.2, episode_ids: episodes }))).toBe("deadline_exceeded");
    // The retried retire waits for r1's free still running, then frees r2; the next attempt opens r2.
    const retried = call("retire", { checkpoint_id: "retire", episode_ids: episodes });
    await flush();
    gate.open();
    await retried;
    expect(kind.hasLiveState()).toBe(false);
    expect(kind.openSession(ep("r2", 1))).toEqual({ restored: false });
    hooks.state.set("r2", { cookie: "new" });
    await waitFor(() => hooks.retired.includes("r1"));
    await flush();
    await flush();
    // The first retire's loop skips r2 (it used to free the new session's cookie).
    expect(hooks.state.get("r2")).toEqual({ cookie: "new" });
    expect(hooks.retired.sort()).toEqual(["r1", "r2"]);
    expect(kind.sessions.stateOf("r2")).toBe("idle");
  });
  it("a forget after a retire that overran its deadline waits for the activation that still runs, freeing nothing under it and lifting no fence before it ended", async () => {
    const { kind, hooks, call } = fresh();
    kind.openSession(ep("r1"));
    hooks.state.set("r1", { cookie: "r1" });
    // The activation ignores the abort signal: the retire waits for it past its deadline.
    const answer = latch();
    let stateSeenAtEnd: unknown = "unset";
    const activation = kind
      .activate(ep("r1"), async (a) => {
        await a.boundary(() => ({ turn: 1 }));
        await a.awaitingModel(answer.promise);
        stateSeenAtEnd = hooks.state.get("r1");
      })
      .catch(() => undefined);
    await waitFor(() => kind.sessions.stateOf("r1") === "at_boundary");
    expect(await code(() => call("retire", { checkpoint_id: "retire", deadline_ts: Date.now() / 1000 + 0.2, episode_ids: [ep("r1")] }))).toBe("deadline_exceeded");
    let forgotten = false;
    const forget = call("forget", { checkpoint_id: "forget", rollout_ids: ["r1"] }).finally(() => void (forgotten = true));
    for (let i = 0; i < 20; i++) await flush();
    // Not freed under the running activation (it used to be, and dropped), and its fence stays
    // (the protocol lifts it once nothing of the attempt can still run): the forget waits.
    expect({ forgotten, retired: hooks.retired, held: kind.sessions.has("r1") }).toEqual({ forgotten: false, retired: [], held: true });
    answer.open();
    await activation;
    expect(await forget).toEqual({ forgotten: ["r1"] });
    expect(stateSeenAtEnd).toEqual({ cookie: "r1" });
    // The overrun retire frees it once the activation ended.
    await waitFor(() => !kind.hasLiveState());
    expect(hooks.retired).toEqual(["r1"]);
  });
  it("a commit's clean-up that outlived its commit never frees a newer session opened on a key a retried close freed meanwhile", async () => {
    const { kind, hooks, call } = fresh();
    for (const id of ["c1", "c2"]) {
      kind.openSession(ep(id));
      hooks.state.set(id, { cookie: id });
    }
    let failing = true;
    const gate = latch();
    let c1Frees = 0;
    const retireHook = hooks.retireAgentSession.bind(hooks);
    hooks.retireAgentSession = async (key: string) => {
      if (failing) throw new Error(`${key}'s state did not free`);
      if (key === "c1" && c1Frees++ === 0) await gate.promise;
      await retireHook(key);
    };
    // Both closes' frees fail: both held for freeing.
    await expect(kind.closeSession(ep("c1"))).rejects.toThrow("did not free");
    await expect(kind.closeSession(ep("c2"))).rejects.toThrow("did not free");
    failing = false;
    await call("prepare", { checkpoint_id: "c3" });
    await call("commit", { checkpoint_id: "c3", deadline_ts: Date.now() / 1000 + 0.3 });
    await call("resume", { checkpoint_id: "c3" });
    // The environment retries c2's close while the clean-up hangs on c1; a new attempt opens c2.
    await kind.closeSession(ep("c2"));
    expect(kind.openSession(ep("c2", 1))).toEqual({ restored: false });
    hooks.state.set("c2", { cookie: "new" });
    gate.open();
    await waitFor(() => !kind.sessions.has("c1"));
    await flush();
    expect(hooks.state.get("c2")).toEqual({ cookie: "new" });
    expect(kind.sessions.stateOf("c2")).toBe("idle");
  });
  it("a closed session held while its free runs refuses its own attempt stale_attempt and a newer one admission_closed (retryable)", async () => {
    const { kind, hooks } = fresh();
    kind.openSession(ep("c1"));
    hooks.state.set("c1", { cookie: "c1" });
    const gate = latch();
    const retireHook = hooks.retireAgentSession.bind(hooks);
    hooks.retireAgentSession = async (key: string) => {
      await gate.promise;
      await retireHook(key);
    };
    const closing = kind.closeSession(ep("c1"));
    await flush();
    expect(await code(() => kind.openSession(ep("c1")))).toBe("stale_attempt");
    expect(await code(() => kind.activate(ep("c1"), async () => 1))).toBe("stale_attempt");
    // The next attempt (dispatched as told by stale_attempt) waits for the free, rather than being refused for good.
    expect(await code(() => kind.openSession(ep("c1", 1)))).toBe("admission_closed");
    expect(await code(() => kind.activate(ep("c1", 1), async () => 1))).toBe("admission_closed");
    expect(hooks.state.get("c1")).toEqual({ cookie: "c1" });
    gate.open();
    await closing;
    expect(kind.openSession(ep("c1", 1))).toEqual({ restored: false });
  });
  it("a session closed while a checkpoint is open whose activation ends stale is held idle, not a blocker, while its free runs", async () => {
    const { kind, hooks, call } = fresh();
    kind.openSession(ep("s1"));
    hooks.state.set("s1", { cookie: "s1" });
    // A policy call made at the boundary is delivered; the loop then runs on (until aborted) with no boundary since.
    const activation = kind
      .activate(ep("s1"), async (a) => {
        await a.boundary(() => ({ turn: 1 }));
        await a.awaitingModel(Promise.resolve("tool"));
        await new Promise((_, reject) => a.signal.addEventListener("abort", () => reject(a.signal.reason), { once: true }));
      })
      .catch(() => undefined);
    await waitFor(() => kind.sessions.stateOf("s1") === "running");
    const gate = latch();
    const retireHook = hooks.retireAgentSession.bind(hooks);
    hooks.retireAgentSession = async (key: string) => {
      await gate.promise;
      await retireHook(key);
    };
    expect((await call("prepare", { checkpoint_id: "c1", deadline_ts: Date.now() / 1000 + 0.3 })).report.blockers).toEqual(["s1"]);
    const closing = kind.closeSession(ep("s1"));
    await activation;
    await flush();
    // Held while its free runs: never exported or restarted, and no blocker either.
    expect(kind.sessions.stateOf("s1")).toBe("idle");
    expect(kind.readiness().blockers).toEqual([]);
    gate.open();
    await closing;
    await call("resume", { checkpoint_id: "c1" });
    expect(kind.hasLiveState()).toBe(false);
  });
  it("a session whose activation ended stale while a checkpoint is open, then closed with a free that fails, is held idle, not a blocker", async () => {
    const { kind, hooks, call } = fresh();
    kind.openSession(ep("s2"));
    hooks.state.set("s2", { cookie: "s2" });
    let respond!: (reply: string) => void;
    const run = kind.activate(ep("s2"), async (a) => {
      await a.boundary(() => ({ turn: 1 }));
      return a.awaitingModel(new Promise<string>((resolve) => (respond = resolve)));
    });
    await flush();
    expect((await call("prepare", { checkpoint_id: "c1" })).report.blockers).toEqual([]);
    respond("tool");
    await run;
    // Ended stale while admission is closed: a blocker until resume, as the restart set is fixed at prepare.
    expect(kind.readiness().blockers).toEqual(["s2"]);
    hooks.retireAgentSession = async () => {
      throw new Error("free failed");
    };
    await expect(kind.closeSession(ep("s2"))).rejects.toThrow("free failed");
    // Closed: held for a later free, neither exported, a restart nor a blocker.
    expect(kind.sessions.stateOf("s2")).toBe("idle");
    expect(kind.readiness()).toMatchObject({ blockers: [], restarts: [] });
    await call("resume", { checkpoint_id: "c1" });
  });

  it("a policy call its activation gave up on (a turn loop's own timeout) that answers after the activation ended changes nothing", async () => {
    const { kind, call } = fresh();
    kind.openSession(ep("g"));
    let respond!: (reply: string) => void;
    const abandoned = new Promise<string>((resolve) => (respond = resolve));
    await expect(
      kind.activate(ep("g"), async (a) => {
        await a.boundary(() => ({ messages: ["S0"] }));
        void a.awaitingModel(abandoned).catch(() => undefined);
        throw new Error("the turn loop's own timeout");
      }),
    ).rejects.toThrow("own timeout");
    expect(kind.sessions.stateOf("g")).toBe("idle");
    respond("late");
    await flush();
    // Still idle at its boundary: no blocker, exported there, and the next activation runs.
    expect(kind.sessions.stateOf("g")).toBe("idle");
    expect(kind.readiness()).toMatchObject({ blockers: [], restarts: [] });
    await call("prepare", { checkpoint_id: "c1" });
    expect((await call("commit", { checkpoint_id: "c1" })).episode_ids).toEqual(["g"]);
    await call("resume", { checkpoint_id: "c1" });
    expect(await kind.activate(ep("g"), async () => "next")).toBe("next");
  });

  it("a session parked at its boundary is released when the checkpoint's lease expires, without a resume", async () => {
    const clock = new ManualClock(1_000_000);
    const kind = new AgentKind(new CookieHooks(), clock);
    const plane = new ParticipantControlPlane({ adapter: kind, instance: "agent0", leaseGraceSeconds: 5, checkpointRoot: root, clock });
    planes.push(plane);
    kind.openSession(ep("lx"));
    let parkedAt = 0;
    const step = latch();
    const run = kind.activate(ep("lx"), async (a) => {
      await a.boundary(() => ({ turn: 1 }));
      await a.awaitingModel(step.promise);
      await a.boundary(() => ({ turn: 2 })); // parks here: the checkpoint opened
      parkedAt = 2;
      return "done";
    });
    await flush();
    await plane.handle("prepare", { checkpoint_id: "c1", deadline_ts: clock.now() / 1000 + 1, epoch: 1 } as never);
    expect(kind.sessions.gate.closed).toBe(true);
    step.open();
    await waitFor(() => kind.sessions.stateOf("lx") === "at_boundary" && kind.readiness().blockers.length === 0);
    expect(parkedAt).toBe(0);
    clock.advance(10_000); // past deadline + grace: nobody resumed it
    await waitFor(() => !kind.sessions.gate.closed);
    expect(await run).toBe("done");
    expect(kind.sessions.stateOf("lx")).toBe("idle");
  });

  it("a session parked on a policy refusal while admission is open retries on the clock the kind was given", async () => {
    const clock = new ManualClock(1_000_000);
    const kind = new AgentKind(new CookieHooks(), clock);
    kind.openSession(ep("pk"));
    let resumed = false;
    const run = kind.activate(ep("pk"), async (a) => {
      await a.boundary(() => ({ turn: 1 }));
      await a.park(); // the policy refused with admission_closed; ours is still open
      resumed = true;
    });
    await waitFor(() => kind.sessions.stateOf("pk") === "at_boundary");
    await expectRetryAfter(clock, 100, () => resumed);
    await run;
  });
});
