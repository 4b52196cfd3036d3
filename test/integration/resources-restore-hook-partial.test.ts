import { mkdir } from "node:fs/promises";
import { describe, expect, it } from "vitest";
import { createResourcesApp, type JsonValue } from "../../participants/kinds/resources/index.js";
import { CounterServer } from "../../participants/gym/resources-server/counter-server.js";
import { phase } from "../support/control-requests.js";
import { participantsOverNats } from "../support/participants-over-nats.js";

// A resources server's restoreSessionStates hook promises all or nothing, but one that fails part
// way (some states installed, then it throws) left those states in the server with no session
// tracking them: the refusal (invalid_checkpoint_state, which the coordinator takes for "nothing
// installed", so it retires nothing there) and the retire of attempt+1 both missed them, and their
// state (a sandbox's compute) was never freed. These drive the participant over a real nats-server
// through the failed restore and the coordinator's clean-up (retire attempt+1, resume), then the
// next checkpoint.

const world = participantsOverNats("itest-res-restore", "res-restore-secret");

const sources = ["r1", "r2", "r3"].map((rollout_id) => ({ rollout_id, attempt: 0 }));
const replacements = sources.map((e) => ({ ...e, attempt: 1 }));
const sessionIds = ["sessionAAAA", "sessionBBBB", "sessionCCCC"];

/** A checkpoint of three counter sessions, r1..r3 at attempt 0. */
async function writeCheckpoint(id: string) {
  const records = sources.map((episode_id, i) => ({ episode_id, session_id: sessionIds[i], state: { count: i + 1 }, owner: null }));
  await world.writeRecords(id, "resources", "res0", records);
}

/** Installs the states one by one and throws at the third, as a hook whose third sandbox failed to start. */
class PartialRestore extends CounterServer {
  freeFailures = 0;
  override async restoreSessionStates(states: Record<string, JsonValue>): Promise<void> {
    for (const [n, [id, state]] of Object.entries(states).entries()) {
      if (n === 2) throw new Error("sandbox for the third session did not start");
      this.counters.set(id, (state as { count: number }).count);
    }
  }
  override async retireSessionState(sessionId: string): Promise<void> {
    if (this.freeFailures > 0 && this.counters.has(sessionId)) {
      this.freeFailures -= 1;
      throw new Error("sandbox did not stop");
    }
    await super.retireSessionState(sessionId);
  }
}

async function serve(server: CounterServer) {
  const { app, kind } = await createResourcesApp(server);
  world.onCleanup(() => app.close());
  const send = await world.serve("resources", "res0", kind);
  const post = (url: string, cookie?: string) => app.inject({ method: "POST", url, payload: {}, ...(cookie ? { headers: { cookie: `ng_session=${cookie}` } } : {}) });
  return { kind, send, post };
}

/** The coordinator's all-or-nothing clean-up of a failed restore, then a whole next checkpoint. */
async function cleanUpThenCheckpoint(send: Awaited<ReturnType<typeof serve>>["send"], post: Awaited<ReturnType<typeof serve>>["post"], id: string) {
  expect(await send("retire", phase(id, { episode_ids: replacements }))).toMatchObject({ retired: ["r1-a1", "r2-a1", "r3-a1"] });
  expect(await send("resume", phase(id))).toEqual({ phase: "idle", idempotent: true });
  // The rollouts start over from input as attempt 2; the next checkpoint exports exactly that.
  const seeded = await post("/ng-rollout/r1-a2/seed_session");
  expect(seeded.statusCode).toBe(200);
  const next = `${id}-next`;
  const prepared = await send("prepare", phase(next));
  expect(prepared).toMatchObject({ phase: "prepared", report: { ready: true, blocker_count: 0 } });
  await mkdir(world.dir(next)); // as the coordinator does before its commit
  const committed = await send("commit", phase(next, { checkpoint_dir: world.dir(next), episode_ids: null }));
  expect(committed).toMatchObject({ phase: "committed", episode_ids: ["r1-a2"] });
  expect(await send("resume", phase(next))).toEqual({ phase: "idle", idempotent: false });
}

describe("resources restore whose hook fails part way", () => {
  it("frees what the hook installed: the refusal (invalid_checkpoint_state) leaves nothing behind, and the clean-up and next checkpoint work", async () => {
    await writeCheckpoint("c1");
    const server = new PartialRestore();
    const { kind, send, post } = await serve(server);

    const refused = await send("restore", phase("c1", { checkpoint_dir: world.dir("c1"), episode_ids: sources }));
    expect(refused.error?.code).toBe("invalid_checkpoint_state");
    expect(refused.error.detail).toContain("sandbox for the third session did not start");
    // Nothing half-installed: the server holds no state, the kind no session.
    expect([...server.counters.keys()]).toEqual([]);
    expect(kind.hasLiveState()).toBe(false);
    const status = await send("status", {});
    expect(status).toMatchObject({ phase: "idle", checkpoint_id: null, report: { ready: true }, extras: { sessions: 0, accepting: true } });

    await cleanUpThenCheckpoint(send, post, "c1");
    expect([...server.counters.keys()]).toHaveLength(1); // only the new attempt's session
  });

  it("a state whose free fails too is held as attempt+1 (refused, a blocker) and answered internal_error, so the clean-up's retire frees it", async () => {
    await writeCheckpoint("c2");
    const server = new PartialRestore();
    server.freeFailures = 1;
    const { kind, send, post } = await serve(server);

    const refused = await send("restore", phase("c2", { checkpoint_dir: world.dir("c2"), episode_ids: sources }));
    // Not a refusal that changed nothing: the coordinator retires attempt+1 here.
    expect(refused.error?.code).toBe("internal_error");
    expect(refused.error.detail).toContain("sandbox did not stop");
    expect([...server.counters]).toEqual([["sessionAAAA", 1]]);
    expect(kind.readiness()).toMatchObject({ blockers: ["r1-a1"], counts: { sessions: 1, restored: 0 } });
    // Never served: the replacement's request on that cookie is refused.
    const stale = await post("/ng-rollout/r1-a1/increment", "sessionAAAA");
    expect(stale.statusCode).toBe(409);
    expect(stale.json()).toMatchObject({ error: { code: "stale_attempt" } });
    expect(server.counters.get("sessionAAAA")).toBe(1);

    await cleanUpThenCheckpoint(send, post, "c2");
    expect(server.counters.has("sessionAAAA")).toBe(false);
  });
});
