import type { ChildProcess } from "node:child_process";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { phase, postRollout, startResourcesWorld, type ResourcesWorld } from "../support/resources-server.js";
import { waitUntil } from "../support/wait-until.js";
import { verifyHold } from "../support/verify-hold.js";

/**
 * Verification in flight at a checkpoint, with real processes: the calculator resources server
 * under `replay` (prepare does not wait; verify runs again after crash + restore) and under
 * `wait` (prepare reports the episode until verify finished; verify never runs twice).
 */
const DEPLOYMENT = "resverify";
const TOKEN = "resources-e2e-secret";
const INSTANCE = "calculator";

let world: ResourcesWorld;

beforeAll(async () => {
  world = await startResourcesWorld(DEPLOYMENT, INSTANCE, TOKEN);
});
afterEach(() => world.killAll());
afterAll(() => world?.close());

/** Spawns the calculator server and resolves with its URL once it printed the ready line. */
const spawnCalculator = (verify: "replay" | "wait", extra: string[] = []): Promise<{ child: ChildProcess; url: string }> => world.spawn(["--server", "calculator", "--verify", verify, ...extra]);
const kill = (child: ChildProcess) => world.kill(child);
const control = (op: Parameters<ResourcesWorld["control"]>[0], body: object) => world.control(op, body);
const post = postRollout;


const task = { expression: "17 + 25", tool_rounds: 1 };
const stats = async (url: string) => (await fetch(`${url}/admin/stats`)).json() as Promise<Record<string, number>>;

async function untilStat(url: string, name: string, value: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  while ((await stats(url))[name] !== value) {
    if (Date.now() > deadline) throw new Error(`${name} never reached ${value}`);
    await new Promise((resolve) => setTimeout(resolve, 20));
  }
}

describe("verify in flight at a checkpoint (real processes)", () => {
  it("replay: an early prepare succeeds and verify runs again after crash + restore", async () => {
    const first = await spawnCalculator("replay");
    const seed = await post(first.url, "r1", "/seed_session", undefined, { task });
    expect(seed.status).toBe(200);
    const cookie = seed.cookie!;
    await verifyHold(first.url, true);
    void post(first.url, "r1", "/verify", cookie, { task, answer: "42" }).catch(() => undefined);
    await untilStat(first.url, "verify_started", 1);
    const prepared = await control("prepare", { ...phase("v-replay"), deadline_ts: Date.now() / 1000 + 1 });
    expect(prepared).toMatchObject({ phase: "prepared", report: { ready: true, blockers: [], counts: { inflight: 0, sessions: 1 } } });
    await mkdir(join(world.root, "v-replay")); // as the coordinator does before its commit
    const commit = await control("commit", phase("v-replay", { checkpoint_dir: join(world.root, "v-replay"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(commit.episode_ids).toEqual(["r1"]);
    await kill(first.child);

    // A short hold of the session its replayable verify ends (a checkpoint may be under way): ended soon after.
    const fresh = await spawnCalculator("replay", ["--replayable-end-hold-ms", "200"]);
    const restore = await control("restore", phase("v-replay", { checkpoint_dir: join(world.root, "v-replay"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(restore.restored).toEqual(["r1-a1"]);
    await control("resume", phase("v-replay"));
    const again = await post(fresh.url, "r1-a1", "/verify", cookie, { task, answer: "42" });
    expect(again).toMatchObject({ status: 200, body: { reward: 1 } });
    expect(await stats(fresh.url)).toMatchObject({ verify_started: 1, verify_finished: 1 });
    await waitUntil(async () => (await control("status", {})).report.counts.sessions === 0, "the held session to end");
    expect((await control("status", {})).report.counts).toMatchObject({ sessions: 0, inflight: 0 });
  });

  it("wait: the early prepare reports the episode as a blocker; verify never runs twice", async () => {
    const server = await spawnCalculator("wait");
    const seed = await post(server.url, "r2", "/seed_session", undefined, { task });
    const cookie = seed.cookie!;
    await verifyHold(server.url, true);
    const verify = post(server.url, "r2", "/verify", cookie, { task, answer: "42" });
    await untilStat(server.url, "verify_started", 1);
    const early = await control("prepare", { ...phase("v-wait"), deadline_ts: Date.now() / 1000 + 1 });
    expect(early).toMatchObject({ phase: "preparing", report: { ready: false, blockers: ["r2"], counts: { inflight: 1 } } });
    // The checkpoint stays open (preparing); once the verify finished, the same prepare succeeds.
    await verifyHold(server.url, false);
    expect((await verify).body).toEqual({ reward: 1 });
    expect((await control("prepare", phase("v-wait"))).phase).toBe("prepared");
    await mkdir(join(world.root, "v-wait"));
    const commit = await control("commit", phase("v-wait", { checkpoint_dir: join(world.root, "v-wait"), episode_ids: null }));
    expect(commit.episode_ids).toEqual([]);
    await control("resume", phase("v-wait"));
    expect(await stats(server.url)).toMatchObject({ verify_started: 1, verify_finished: 1 });
  });
});
