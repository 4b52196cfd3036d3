import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { mkdir, readFile, rm, writeFile } from "node:fs/promises";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CONTROLLER_TOKEN, DEFAULT_MEMBERS, startWorld, type World } from "../integration/coordinator-harness.js";
import { freePortRun } from "../support/ports.js";
import { waitUntil } from "../support/wait-until.js";
import { cli, daemonArgs, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * docs/examples/python_controller.py, run with python3 against a real coordinator daemon (HTTP API)
 * and participants over a real nats-server: it checkpoints step by step, and a second run after a
 * whole-job restart (fresh participant processes) restores LATEST and goes on from it. Everything
 * is asserted from outside: its exit code and output, `gym-ckpt ls --json`, checkpoint.json, the
 * participants' state.
 */

const SCRIPT = "docs/examples/python_controller.py";
const SCOPE = [
  { rollout_id: "r1", attempt: 0 },
  { rollout_id: "r2", attempt: 0 },
];
/** The participants that hold the rollouts (the others hold nothing of them). */
const HOLDERS = ["env1", "policy", "agent1"];

let world: World;
let daemon: DaemonProcess;
let url: string;
let env: Record<string, string>;
const scripts = new Set<ChildProcess>();

/**
 * Each test fails (never skips) when python3 is missing, so CI counts it: test/support/prepare-env.sh
 * installs it. Checked in the tests, not in beforeAll, whose failure vitest reports as skipped tests.
 */
let pythonChecked = false;
function requirePython(): void {
  if (pythonChecked) return;
  try {
    execFileSync("python3", ["--version"], { stdio: "ignore" });
  } catch {
    throw new Error("python3 is missing: run `apt-get install -y python3` (test/support/prepare-env.sh does it as root)");
  }
  pythonChecked = true;
}

/** Fresh participant processes; the model refuses a null scope, as the real model kind does. */
async function startParticipants(): Promise<void> {
  const started = await world.startParticipants(DEFAULT_MEMBERS);
  for (const p of started) {
    if (p.kind === "model") p.adapter.scopeRequired = true;
  }
}

/** Runs the script to its exit (bounded: killed after 60 s); stdout's JSON lines parsed. */
async function runScript(args: string[], token = CONTROLLER_TOKEN, baseUrl = url) {
  requirePython();
  const child = spawn("python3", [SCRIPT, "--url", baseUrl, ...args], { env: { ...process.env, GYM_CKPT_CONTROLLER_TOKEN: token }, stdio: ["ignore", "pipe", "pipe"] });
  scripts.add(child);
  let stdout = "";
  let stderr = "";
  child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
  child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
  const timer = setTimeout(() => child.kill("SIGKILL"), 60_000);
  const code = await new Promise<number | null>((resolve) => child.once("close", resolve));
  clearTimeout(timer);
  scripts.delete(child);
  const lines = stdout.split("\n").filter(Boolean).map((line) => JSON.parse(line) as Record<string, unknown>);
  return { code, lines, stderr };
}

async function listed(): Promise<{ latest: string | null; checkpoints: { checkpoint_id: string }[] }> {
  const ls = await cli(["ls", "--json"], env);
  expect([ls.code, ls.stderr]).toEqual([0, ""]);
  return JSON.parse(ls.stdout);
}

const manifestOf = async (id: string) => JSON.parse(await readFile(join(world.root, id, "checkpoint.json"), "utf8"));

beforeAll(async () => {
  ensureBuilt();
  world = await startWorld();
  await startParticipants();
  for (const instance of HOLDERS) for (const e of SCOPE) world.participant(instance).adapter.addEpisode(e, { at: instance });
  const port = await freePortRun(1);
  url = `http://127.0.0.1:${port}`;
  daemon = spawnDaemon(daemonArgs(world, ["--http-host", "127.0.0.1", "--http-port", String(port), "--retention", "10"]));
  env = { GYM_CKPT_CHECKPOINT_ROOT: world.root };
  await waitUntil(async () => {
    if (daemon.child.exitCode !== null) throw new Error(`the coordinator exited:\n${daemon.stderr()}`);
    return (await fetch(`${url}/readyz`).catch(() => undefined))?.status === 200;
  }, "the coordinator to be the ready leader");
}, 60_000);

afterAll(async () => {
  for (const child of scripts) child.kill("SIGKILL");
  await daemon?.kill();
  await world?.close();
});

describe("the Python controller example (docs/examples/python_controller.py)", () => {
  let firstLatest: string;

  it("checkpoints every step the fine-grained way, publishing its own state inline", async () => {
    const run = await runScript(["--steps", "3", "--rollouts", "r1,r2"]);
    expect([run.code, run.stderr]).toEqual([0, ""]);
    expect(run.lines[0]).toEqual({ event: "fresh_start" });
    const steps = run.lines.slice(1);
    expect(steps.map((l) => [l.step, l.in_flight, typeof l.checkpoint_id])).toEqual([
      [1, 2, "string"],
      [2, 2, "string"],
      [3, 2, "string"],
    ]);
    const ids = steps.map((l) => l.checkpoint_id as string);
    const { latest, checkpoints } = await listed();
    expect(checkpoints.map((c) => c.checkpoint_id)).toEqual([...ids].reverse());
    firstLatest = ids[2]!;
    expect(latest).toBe(firstLatest);
    const manifest = await manifestOf(firstLatest);
    expect(manifest.scope).toEqual(SCOPE);
    expect(manifest.controller_state).toEqual({ inline: { step: 3, loss: steps[2]!.loss, in_flight: SCOPE } });
    // Every step resumed: nobody is left parked.
    for (const p of world.participants) expect(p.handle.controlPlane.currentPhase).toBe("idle");
  }, 90_000);

  it("a second run after a whole-job restart restores LATEST, resumes it and goes on as attempt + 1", async () => {
    await world.stopParticipants();
    await startParticipants();
    const run = await runScript(["--steps", "2", "--rollouts", "r1,r2"]);
    expect([run.code, run.stderr]).toEqual([0, ""]);
    const holders = Object.fromEntries(HOLDERS.map((i) => [`${world.participant(i).kind}/${i}`, ["r1-a1", "r2-a1"]]));
    expect(run.lines[0]).toEqual({ event: "restored", checkpoint_id: firstLatest, step: 3, restored: expect.objectContaining(holders) });
    expect(run.lines.slice(1).map((l) => l.step)).toEqual([4, 5]);
    // The fresh processes installed the checkpoint as attempt + 1, and were resumed.
    for (const instance of HOLDERS) {
      const p = world.participant(instance);
      expect([instance, [...p.adapter.restored.keys()].sort()]).toEqual([instance, ["r1-a1", "r2-a1"]]);
    }
    for (const p of world.participants) expect([p.instance, p.handle.controlPlane.currentPhase]).toEqual([p.instance, "idle"]);
    // Its checkpoints continue the restored state and the next attempts.
    const { latest, checkpoints } = await listed();
    expect(checkpoints).toHaveLength(5);
    expect(latest).toBe(run.lines[2]!.checkpoint_id);
    const next = SCOPE.map((e) => ({ ...e, attempt: 1 }));
    const manifest = await manifestOf(latest!);
    expect(manifest.scope).toEqual(next);
    expect(manifest.controller_state.inline).toMatchObject({ step: 5, in_flight: next });
  }, 90_000);

  it("a second run with the Gym processes still running (only the trainer restarted): restore refused stale_checkpoint, attempt + 1 retired, those rollouts start over as attempt + 2", async () => {
    const { latest: restoredFrom } = await listed();
    const run = await runScript(["--steps", "1", "--rollouts", "r1,r2"]);
    expect([run.code, run.stderr]).toEqual([0, ""]);
    expect(run.lines[0]).toEqual({ event: "restarted_from_input", checkpoint_id: restoredFrom, step: 5, code: "stale_checkpoint" });
    for (const instance of HOLDERS) {
      const p = world.participant(instance);
      expect([instance, p.adapter.calls.filter((c) => c.hook === "retire").map((c) => c.detail)]).toEqual([instance, [["r1-a2", "r2-a2"]]]);
      expect([instance, p.adapter.restored.size]).toEqual([instance, 0]); // the retire freed attempt 1's restored state
    }
    const { latest } = await listed();
    expect(latest).toBe(run.lines[1]!.checkpoint_id);
    expect((await manifestOf(latest!)).scope).toEqual(SCOPE.map((e) => ({ ...e, attempt: 3 })));
  }, 30_000);

  it("a commit that fails after prepare: the script resumes before it exits 1, so nobody stays parked", async () => {
    const before = await listed();
    world.participant("agent2").adapter.failNext("exportRecords");
    const run = await runScript(["--steps", "1", "--rollouts", "r1,r2"]);
    expect(run.code).toBe(1);
    expect(run.lines).toEqual([expect.objectContaining({ event: "restarted_from_input" })]);
    expect(run.stderr).toMatch(/^error internal_error: commit failed on 1 participant\(s\): agent\/agent2: internal_error; [^\n]*\n$/);
    // Every other participant committed, and is idle again: the script's resume.
    for (const p of world.participants) expect([p.instance, p.handle.controlPlane.currentPhase]).toEqual([p.instance, "idle"]);
    expect((await listed()).checkpoints).toEqual(before.checkpoints);
  }, 30_000);

  it("a LATEST another controller published (no inline state of ours) is not restored: a fresh start naming it, not a TypeError", async () => {
    // As `gym-ckpt checkpoint --episodes ""` publishes it: controller_state null.
    const published = await fetch(`${url}/v1/checkpoint`, {
      method: "POST",
      headers: { authorization: `Bearer ${CONTROLLER_TOKEN}`, "content-type": "application/json" },
      body: JSON.stringify({ episode_ids: [] }),
    });
    expect(published.status).toBe(200);
    const { checkpoint_id: theirs } = (await published.json()) as { checkpoint_id: string };
    expect((await manifestOf(theirs)).controller_state).toBeNull();
    const before = await listed();
    expect(before.latest).toBe(theirs);
    const run = await runScript(["--steps", "0"]);
    expect([run.code, run.stderr]).toEqual([0, ""]);
    expect(run.lines).toEqual([{ event: "fresh_start", not_ours: theirs }]);
    // Nothing restored or left parked.
    for (const p of world.participants) expect([p.instance, p.handle.controlPlane.currentPhase]).toEqual([p.instance, "idle"]);
    expect(await listed()).toEqual(before);
  }, 30_000);

  it("a damaged LATEST (list answers latest null with latest_error): exits 1 naming its code, no fresh start, nothing published", async () => {
    const latestFile = join(world.root, "LATEST");
    const before = { latest: await readFile(latestFile, "utf8"), listing: (await listed()).checkpoints };
    await writeFile(latestFile, "not a checkpoint id!\n");
    try {
      const run = await runScript(["--steps", "1", "--rollouts", "r1"]);
      // Started fresh, it would publish a step and move LATEST past the state it holds in an older checkpoint.
      expect(run.code).toBe(1);
      expect(run.lines).toEqual([]);
      expect(run.stderr).toMatch(/^error invalid_checkpoint_state: LATEST is damaged \(LATEST does not name a checkpoint id\)/);
      expect(await readFile(latestFile, "utf8")).toBe("not a checkpoint id!\n");
    } finally {
      await writeFile(latestFile, before.latest);
    }
    expect((await listed()).checkpoints).toEqual(before.listing);
  }, 30_000);

  it("a damaged checkpoint directory beside a damaged LATEST: named (list's damaged) before it exits 1", async () => {
    const latestFile = join(world.root, "LATEST");
    const before = await readFile(latestFile, "utf8").catch(() => undefined);
    await mkdir(join(world.root, "c-damaged"));
    await writeFile(join(world.root, "c-damaged", "checkpoint.json"), "{not json");
    await writeFile(latestFile, "c-damaged\n");
    try {
      const run = await runScript(["--steps", "1", "--rollouts", "r1"]);
      expect(run.code).toBe(1);
      expect(run.lines).toEqual([{ event: "damaged_checkpoint", checkpoint_id: "c-damaged", code: "invalid_checkpoint_state", detail: expect.stringContaining("not valid JSON") }]);
      expect(run.stderr).toMatch(/^error invalid_checkpoint_state: LATEST is damaged /);
    } finally {
      await (before === undefined ? rm(latestFile, { force: true }) : writeFile(latestFile, before));
      await rm(join(world.root, "c-damaged"), { recursive: true, force: true });
    }
  }, 30_000);

  it("a wrong token: exits 1 naming the catalog code unauthorized, nothing published", async () => {
    const before = await listed();
    const run = await runScript(["--steps", "1"], "wrong-token");
    expect(run.code).toBe(1);
    expect(run.lines).toEqual([]);
    expect(run.stderr).toMatch(/^error unauthorized: /);
    expect(await listed()).toEqual(before);
  }, 30_000);

  // urllib followed a 301/302 (an ingress sending http:// on to https://), sending the token on to
  // whatever host the Location named, and a POST on as a bodiless GET: the op came back as the
  // target's refusal of another request. As HttpControllerClient: not followed, invalid_request.
  it("a redirect in front of the coordinator: exits 1 invalid_request naming it; the token is not sent where it points", async () => {
    const received: string[] = [];
    const target = createServer((req, res) => {
      received.push(`${req.method} ${req.url} ${req.headers.authorization ?? ""}`);
      res.writeHead(404, { "content-type": "application/json" }).end(JSON.stringify({ error: { code: "not_found", detail: "elsewhere" } }));
    });
    const redirecting = createServer((req, res) => void res.writeHead(301, { location: `http://127.0.0.1:${(target.address() as AddressInfo).port}${req.url}` }).end());
    await Promise.all([target, redirecting].map((server) => new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve))));
    try {
      const run = await runScript(["--steps", "1"], CONTROLLER_TOKEN, `http://127.0.0.1:${(redirecting.address() as AddressInfo).port}`);
      expect(run.code).toBe(1);
      expect(run.stderr).toMatch(/^error invalid_request: .*redirect/);
      expect(received).toEqual([]);
    } finally {
      for (const server of [target, redirecting]) {
        server.closeAllConnections();
        await new Promise((resolve) => server.close(resolve));
      }
    }
  }, 30_000);
});
