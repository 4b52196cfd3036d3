import type { ChildProcess } from "node:child_process";
import { mkdir } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { phase, postRollout, startResourcesWorld, type ResourcesWorld } from "../support/resources-server.js";

/**
 * Exported resources state survives a crash: real nats-server, the counter resources server
 * spawned from dist, killed with SIGKILL, a fresh process restored through NATS control requests.
 */
const DEPLOYMENT = "rese2e";
const TOKEN = "resources-e2e-secret";
const INSTANCE = "counter";

let world: ResourcesWorld;

beforeAll(async () => {
  world = await startResourcesWorld(DEPLOYMENT, INSTANCE, TOKEN);
});
afterEach(() => world.killAll());
afterAll(() => world?.close());

/** Spawns the counter server and resolves with its URL once it printed the ready line. */
const spawnCounter = (): Promise<{ child: ChildProcess; url: string }> => world.spawn(["--server", "counter"]);
const kill = (child: ChildProcess) => world.kill(child);
const control = (op: Parameters<ResourcesWorld["control"]>[0], body: object) => world.control(op, body);
const post = (url: string, key: string, route: string, cookie?: string) => postRollout(url, key, route, cookie);

/** Two increments, a checkpoint of r1, then SIGKILL. Returns the session cookie. */
async function countToTwoAndCrash(checkpointId: string): Promise<string> {
  const first = await spawnCounter();
  const seed = await post(first.url, "r1", "/seed_session");
  expect(seed.status).toBe(200);
  const cookie = seed.cookie!;
  expect((await post(first.url, "r1", "/increment", cookie)).body).toEqual({ count: 1 });
  expect((await post(first.url, "r1", "/increment", cookie)).body).toEqual({ count: 2 });
  expect((await control("prepare", phase(checkpointId))).phase).toBe("prepared");
  await mkdir(join(world.root, checkpointId)); // as the coordinator does before its commit
  const commit = await control("commit", phase(checkpointId, { checkpoint_dir: join(world.root, checkpointId), episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
  expect(commit).toMatchObject({ phase: "committed", episode_ids: ["r1"] });
  await kill(first.child);
  return cookie;
}

describe("exported resources state across a crash (real processes)", () => {
  it("two increments, crash, restore, resume: the next increment returns 3", async () => {
    const cookie = await countToTwoAndCrash("cnt-1");
    const fresh = await spawnCounter();
    const restore = await control("restore", phase("cnt-1", { checkpoint_dir: join(world.root, "cnt-1"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(restore).toEqual({ phase: "restored", source_checkpoint_id: "cnt-1", restored: ["r1-a1"], incarnation: expect.any(String) });
    // The replacement's request waits while restored, and continues at resume.
    let answered = false;
    const next = post(fresh.url, "r1-a1", "/increment", cookie).then((r) => ((answered = true), r));
    const deadline = Date.now() + 10_000;
    while ((await control("status", {})).report.counts.waiting !== 1) {
      if (Date.now() > deadline) throw new Error("the increment never waited");
      await new Promise((resolve) => setTimeout(resolve, 20));
    }
    expect(answered).toBe(false);
    expect(await control("resume", phase("cnt-1"))).toEqual({ phase: "idle", idempotent: false });
    expect(await next).toMatchObject({ status: 200, body: { count: 3 } });
    // The old attempt's cookie use is fenced: the session now belongs to r1-a1.
    expect((await post(fresh.url, "r1", "/increment", cookie)).body.error.code).toBe("stale_attempt");
  });

  it("negative control: without restoring the resources participant the count is wrong", async () => {
    const cookie = await countToTwoAndCrash("cnt-2");
    const fresh = await spawnCounter();
    const next = await post(fresh.url, "r1-a1", "/increment", cookie);
    expect(next).toMatchObject({ status: 200, body: { count: 1 } });
    expect((await control("status", {})).extras).toMatchObject({ mode: "exported", verify: "wait", restored: 0 });
  });
});
