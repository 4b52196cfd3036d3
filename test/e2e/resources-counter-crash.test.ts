import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { headers } from "@nats-io/transport-node";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { participantSubject, type Op } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";

/**
 * Exported resources state survives a crash: real nats-server, the counter resources server
 * spawned from dist, killed with SIGKILL, a fresh process restored through NATS control requests.
 */
const DEPLOYMENT = "rese2e";
const TOKEN = "resources-e2e-secret";
const INSTANCE = "counter";
const MAIN = join(process.cwd(), "dist/participants/gym/resources-server/main.js");

let nats: NatsFixture;
let root: string;
const children = new Set<ChildProcess>();

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-res-e2e-"));
});

afterEach(() => {
  for (const child of children) child.kill("SIGKILL");
  children.clear();
});

afterAll(async () => {
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});

/** Spawns the counter server and resolves with its URL once it printed the ready line. */
async function spawnCounter(): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(
    process.execPath,
    [MAIN, "--server", "counter", "--nats", nats.server.url, "--deployment", DEPLOYMENT, "--instance", INSTANCE, "--token", TOKEN, "--checkpoint-root", root],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  children.add(child);
  let stderr = "";
  child.stderr!.on("data", (chunk) => (stderr += String(chunk)));
  const url = await new Promise<string>((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`counter server not ready: ${stderr}`)), 20_000);
    child.once("exit", (code) => reject(new Error(`counter server exited ${code}: ${stderr}`)));
    createInterface({ input: child.stdout! }).on("line", (line) => {
      try {
        const parsed = JSON.parse(line) as { ready?: boolean; url?: string };
        if (parsed.ready === true && parsed.url) {
          clearTimeout(timer);
          resolve(parsed.url);
        }
      } catch {
        // not the ready line
      }
    });
  });
  return { child, url };
}

async function kill(child: ChildProcess): Promise<void> {
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGKILL");
  await exited;
  children.delete(child);
}

async function control(op: Op, body: object): Promise<any> {
  const h = headers();
  h.set("Authorization", `Bearer ${TOKEN}`);
  const msg = await nats.nc.request(participantSubject(DEPLOYMENT, "resources", INSTANCE, op), JSON.stringify(body), { timeout: 10_000, headers: h });
  return msg.json();
}

const phase = (id: string, extra: object = {}) => ({ checkpoint_id: id, deadline_ts: Date.now() / 1000 + 30, epoch: 1, ...extra });

async function post(url: string, key: string, route: string, cookie?: string): Promise<{ status: number; body: any; cookie?: string }> {
  const response = await fetch(`${url}/ng-rollout/${key}${route}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(cookie && { cookie }) },
    body: "{}",
  });
  const setCookie = response.headers.get("set-cookie");
  return { status: response.status, body: await response.json(), ...(setCookie && { cookie: setCookie.split(";")[0]! }) };
}

/** Two increments, a checkpoint of r1, then SIGKILL. Returns the session cookie. */
async function countToTwoAndCrash(checkpointId: string): Promise<string> {
  const first = await spawnCounter();
  const seed = await post(first.url, "r1", "/seed_session");
  expect(seed.status).toBe(200);
  const cookie = seed.cookie!;
  expect((await post(first.url, "r1", "/increment", cookie)).body).toEqual({ count: 1 });
  expect((await post(first.url, "r1", "/increment", cookie)).body).toEqual({ count: 2 });
  expect((await control("prepare", phase(checkpointId))).phase).toBe("prepared");
  const commit = await control("commit", phase(checkpointId, { checkpoint_dir: join(root, checkpointId), episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
  expect(commit).toMatchObject({ phase: "committed", episode_ids: ["r1"] });
  await kill(first.child);
  return cookie;
}

describe("exported resources state across a crash (real processes)", () => {
  it("two increments, crash, restore, resume: the next increment returns 3", async () => {
    const cookie = await countToTwoAndCrash("cnt-1");
    const fresh = await spawnCounter();
    const restore = await control("restore", phase("cnt-1", { checkpoint_dir: join(root, "cnt-1"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(restore).toEqual({ phase: "restored", source_checkpoint_id: "cnt-1", restored: ["r1-a1"] });
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
