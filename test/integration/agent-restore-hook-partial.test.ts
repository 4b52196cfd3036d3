import { mkdir } from "node:fs/promises";
import { describe, expect, it } from "vitest";
import { AgentKind, type RestoredAgentSession } from "../../participants/kinds/agent/index.js";
import { AgentSessionState } from "../../participants/gym/agent-server/agent-session-state.js";
import { phase } from "../support/control-requests.js";
import { participantsOverNats } from "../support/participants-over-nats.js";

// The agent's restoreAgentSessions hook promises all or nothing, as the resources hook does. One
// that threw after installing some sessions left them in the agent's own state with no session
// tracking them: the clean-up's retire of attempt+1 never freed them, and the reference agent's
// open_session of the restarted rollout (attempt+2) inherited the dead restore's resources cookie.
// Driven over a real nats-server through the failed restore, the coordinator's clean-up
// (retire attempt+1, resume) and the next checkpoint.

const world = participantsOverNats("itest-agent-restore", "agent-restore-secret");

const sources = ["r1", "r2", "r3"].map((rollout_id) => ({ rollout_id, attempt: 0 }));
const replacements = sources.map((e) => ({ ...e, attempt: 1 }));

async function writeCheckpoint(id: string) {
  const records = sources.map((episode_id, i) => ({
    episode_id,
    mode: "session",
    session_key: episode_id.rollout_id,
    session: { cookie: `cookie-${i}` },
    boundary: { turn: i },
    episode: null,
  }));
  await world.writeRecords(id, "agent", "agent0", records);
}

/** The reference agent's state, whose restore installs one by one and throws at the third. */
class PartialRestore extends AgentSessionState {
  freeFailures = 0;
  override async restoreAgentSessions(restored: RestoredAgentSession[]): Promise<void> {
    for (const [n, r] of restored.entries()) {
      if (n === 2) throw new Error("the third session's state did not load");
      this.set(r.session_key, r.session as { cookie: string });
    }
  }
  override async retireAgentSession(key: string): Promise<void> {
    if (this.freeFailures > 0 && this.sessions.has(key)) {
      this.freeFailures -= 1;
      throw new Error("the session's state did not free");
    }
    await super.retireAgentSession(key);
  }
}

async function serve(state: AgentSessionState) {
  const kind = new AgentKind(state);
  const send = await world.serve("agent", "agent0", kind);
  return { kind, send };
}

/** The coordinator's clean-up of the failed restore, then the rollout restarted as attempt 2 and a whole checkpoint of it. */
async function cleanUpThenCheckpoint({ kind, send }: Awaited<ReturnType<typeof serve>>, id: string) {
  expect(await send("retire", phase(id, { episode_ids: replacements }))).toMatchObject({ retired: ["r1-a1", "r2-a1", "r3-a1"] });
  expect(await send("resume", phase(id))).toEqual({ phase: "idle", idempotent: true });
  expect(kind.openSession({ rollout_id: "r1", attempt: 2 })).toEqual({ restored: false });
  const next = `${id}-next`;
  expect(await send("prepare", phase(next))).toMatchObject({ phase: "prepared", report: { ready: true, blocker_count: 0 } });
  await mkdir(world.dir(next)); // as the coordinator does before its commit
  expect(await send("commit", phase(next, { checkpoint_dir: world.dir(next), episode_ids: null }))).toMatchObject({ phase: "committed", episode_ids: ["r1-a2"] });
  expect(await send("resume", phase(next))).toEqual({ phase: "idle", idempotent: false });
}

describe("agent restore whose session hook fails part way", () => {
  it("frees what the hook installed before answering, and the clean-up and next checkpoint work", async () => {
    await writeCheckpoint("c1");
    const state = new PartialRestore();
    const served = await serve(state);

    const refused = await served.send("restore", phase("c1", { checkpoint_dir: world.dir("c1"), episode_ids: sources }));
    expect(refused.error?.code).toBe("internal_error");
    expect(refused.error.detail).toContain("the third session's state did not load");
    expect([...state.sessions.keys()]).toEqual([]);
    expect(served.kind.hasLiveState()).toBe(false);

    await cleanUpThenCheckpoint(served, "c1");
    // The restarted rollout's session is its own, not the failed restore's (no inherited cookie).
    expect(state.get("r1")).toBeUndefined();
  });

  it("a session whose free fails too is held as attempt+1 (a blocker) until the clean-up's retire frees it", async () => {
    await writeCheckpoint("c2");
    const state = new PartialRestore();
    state.freeFailures = 1;
    const served = await serve(state);

    const refused = await served.send("restore", phase("c2", { checkpoint_dir: world.dir("c2"), episode_ids: sources }));
    expect(refused.error?.code).toBe("internal_error");
    expect(refused.error.detail).toContain("the session's state did not free");
    expect([...state.sessions.keys()]).toEqual(["r1"]);
    expect(served.kind.readiness()).toMatchObject({ blockers: ["r1-a1"], counts: { sessions: 1, restored_pending: 0 } });
    // Never served: the replacement can neither open nor activate it.
    const r1a1 = { rollout_id: "r1", attempt: 1 };
    expect(() => served.kind.openSession(r1a1)).toThrow(expect.objectContaining({ code: "stale_attempt" }));
    expect(() => served.kind.activate(r1a1, async () => "ran")).toThrow(expect.objectContaining({ code: "stale_attempt" }));
    // The same restore sent again (a successor re-driving it, its clean-up lost with the leader) is
    // refused the same way, not as "not fresh", so the coordinator retires attempt+1 here all the same.
    expect((await served.send("restore", phase("c2", { checkpoint_dir: world.dir("c2"), episode_ids: sources }))).error).toEqual(refused.error);
    // Another restore is refused as ever: this process holds state.
    expect((await served.send("restore", phase("c2", { checkpoint_dir: world.dir("c2"), episode_ids: sources.slice(1) }))).error?.code).toBe("invalid_checkpoint_state");

    await cleanUpThenCheckpoint(served, "c2");
    expect(state.get("r1")).toBeUndefined();
  });

  it("a clean-up retire whose free fails too keeps the session held, so a retried retire frees it", async () => {
    await writeCheckpoint("c3");
    const state = new PartialRestore();
    state.freeFailures = 1;
    const served = await serve(state);

    const refused = await served.send("restore", phase("c3", { checkpoint_dir: world.dir("c3"), episode_ids: sources }));
    expect(refused.error?.code).toBe("internal_error");
    state.freeFailures = 1; // the clean-up's first retire fails to free it too
    const failed = await served.send("retire", phase("c3", { episode_ids: replacements }));
    expect(failed.error?.code).toBe("internal_error");
    expect(failed.error.detail).toContain("the session's state did not free");
    // Still held and still a blocker: the state it names was not freed.
    expect([...state.sessions.keys()]).toEqual(["r1"]);
    expect(served.kind.readiness()).toMatchObject({ blockers: ["r1-a1"], counts: { sessions: 1 } });

    // The retried retire finds it again and frees it; the next checkpoint goes ahead.
    await cleanUpThenCheckpoint(served, "c3");
    expect(state.get("r1")).toBeUndefined();
  });

  it("forget frees a session a failed retire left held, and keeps the fence while that free fails", async () => {
    await writeCheckpoint("c4");
    const state = new PartialRestore();
    state.freeFailures = 1;
    const served = await serve(state);

    expect((await served.send("restore", phase("c4", { checkpoint_dir: world.dir("c4"), episode_ids: sources }))).error?.code).toBe("internal_error");
    state.freeFailures = 1;
    expect((await served.send("retire", phase("c4", { episode_ids: replacements }))).error?.code).toBe("internal_error");
    expect((await served.send("resume", phase("c4"))).phase).toBe("idle");
    const r1a2 = { rollout_id: "r1", attempt: 2 };

    // A forget whose free fails too keeps the fence and the held session.
    state.freeFailures = 1;
    expect((await served.send("forget", phase("forget", { rollout_ids: ["r1"] }))).error?.code).toBe("internal_error");
    expect(served.kind.readiness().blockers).toEqual(["r1-a1"]);
    expect(() => served.kind.openSession({ rollout_id: "r1", attempt: 1 })).toThrow(expect.objectContaining({ code: "stale_attempt" }));

    expect(await served.send("forget", phase("forget", { rollout_ids: ["r1"] }))).toEqual({ forgotten: ["r1"] });
    expect(state.get("r1")).toBeUndefined();
    expect(served.kind.readiness().blockers).toEqual([]);
    expect(served.kind.openSession(r1a2)).toEqual({ restored: false });
    expect(state.get("r1")).toBeUndefined();
    expect(await served.send("prepare", phase("c4-next"))).toMatchObject({ phase: "prepared", report: { ready: true, blocker_count: 0 } });
    expect(await served.send("resume", phase("c4-next"))).toEqual({ phase: "idle", idempotent: false });
  });
});
