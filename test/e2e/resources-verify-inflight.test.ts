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
 * Verification in flight at a checkpoint, with real processes: the calculator resources server
 * under `replay` (prepare does not wait; verify runs again after crash + restore) and under
 * `wait` (prepare reports the episode until verify finished; verify never runs twice).
 */
const DEPLOYMENT = "resverify";
const TOKEN = "resources-e2e-secret";
const INSTANCE = "calculator";
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

/** Spawns the calculator server and resolves with its URL once it printed the ready line. */
async function spawnCalculator(verify: "replay" | "wait"): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(
    process.execPath,
    [MAIN, "--server", "calculator", "--verify", verify, "--nats", nats.server.url, "--deployment", DEPLOYMENT, "--instance", INSTANCE, "--token", TOKEN, "--checkpoint-root", root],
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

async function post(url: string, key: string, route: string, cookie?: string, body: object = {}): Promise<{ status: number; body: any; cookie?: string }> {
  const response = await fetch(`${url}/ng-rollout/${key}${route}`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(cookie && { cookie }) },
    body: JSON.stringify(body),
  });
  const setCookie = response.headers.get("set-cookie");
  return { status: response.status, body: await response.json(), ...(setCookie && { cookie: setCookie.split(";")[0]! }) };
}


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
    await fetch(`${first.url}/admin/verify/hold`);
    void post(first.url, "r1", "/verify", cookie, { task, answer: "42" }).catch(() => undefined);
    await untilStat(first.url, "verify_started", 1);
    const prepared = await control("prepare", { ...phase("v-replay"), deadline_ts: Date.now() / 1000 + 1 });
    expect(prepared).toMatchObject({ phase: "prepared", report: { ready: true, blockers: [], counts: { inflight: 0, sessions: 1 } } });
    const commit = await control("commit", phase("v-replay", { checkpoint_dir: join(root, "v-replay"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(commit.episode_ids).toEqual(["r1"]);
    await kill(first.child);

    const fresh = await spawnCalculator("replay");
    const restore = await control("restore", phase("v-replay", { checkpoint_dir: join(root, "v-replay"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(restore.restored).toEqual(["r1-a1"]);
    await control("resume", phase("v-replay"));
    const again = await post(fresh.url, "r1-a1", "/verify", cookie, { task, answer: "42" });
    expect(again).toMatchObject({ status: 200, body: { reward: 1 } });
    expect(await stats(fresh.url)).toMatchObject({ verify_started: 1, verify_finished: 1 });
    expect((await control("status", {})).report.counts).toMatchObject({ sessions: 0, inflight: 0 });
  });

  it("wait: the early prepare reports the episode as a blocker; verify never runs twice", async () => {
    const server = await spawnCalculator("wait");
    const seed = await post(server.url, "r2", "/seed_session", undefined, { task });
    const cookie = seed.cookie!;
    await fetch(`${server.url}/admin/verify/hold`);
    const verify = post(server.url, "r2", "/verify", cookie, { task, answer: "42" });
    await untilStat(server.url, "verify_started", 1);
    const early = await control("prepare", { ...phase("v-wait"), deadline_ts: Date.now() / 1000 + 1 });
    expect(early).toMatchObject({ phase: "preparing", report: { ready: false, blockers: ["r2"], counts: { inflight: 1 } } });
    // The checkpoint stays open (preparing); once the verify finished, the same prepare succeeds.
    await fetch(`${server.url}/admin/verify/release`);
    expect((await verify).body).toEqual({ reward: 1 });
    expect((await control("prepare", phase("v-wait"))).phase).toBe("prepared");
    const commit = await control("commit", phase("v-wait", { checkpoint_dir: join(root, "v-wait"), episode_ids: null }));
    expect(commit.episode_ids).toEqual([]);
    await control("resume", phase("v-wait"));
    expect(await stats(server.url)).toMatchObject({ verify_started: 1, verify_finished: 1 });
  });
});
