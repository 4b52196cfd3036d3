import { execFileSync, spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, rmSync, writeFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { docSamples, PACKAGE_ROOT } from "../support/doc-samples.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { postRollout } from "../support/resources-server.js";
import { waitUntil } from "../support/wait-until.js";
import { cli, ensureBuilt, MAIN, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * The resources server of docs/resources.md, as an integrator copies it: compiled from the page
 * against the built package, run as its own process beside a real nats-server and coordinator
 * daemon, checkpointed and restored through the CLI after a SIGKILL. doc-samples.test.ts only
 * type-checks the samples; this one keeps the page's integration walk-through working.
 */
const TOKEN = "doc-example-token";
// Inside the package (.tmp/ is gitignored), so `gym-ckpt/…` resolves by self-reference to dist/.
const WORK = join(PACKAGE_ROOT, ".tmp", `doc-resources-example-${process.pid}`);

let nats: NatsFixture;
let root: string;
let daemon: DaemonProcess;
let env: Record<string, string>;
const servers = new Set<ChildProcess>();

beforeAll(async () => {
  ensureBuilt();
  const sample = docSamples().find((s) => s.doc === "resources.md");
  if (!sample) throw new Error("docs/resources.md has no TypeScript sample with imports");
  mkdirSync(WORK, { recursive: true });
  writeFileSync(join(WORK, "calculator.ts"), `${sample.code}\nexport {};\n`);
  const tsc = join(PACKAGE_ROOT, "node_modules", "typescript", "bin", "tsc");
  execFileSync(process.execPath, [tsc, "--strict", "--module", "nodenext", "--moduleResolution", "nodenext", "--target", "es2022", "--skipLibCheck", "--rootDir", WORK, "--outDir", WORK, join(WORK, "calculator.ts")], { cwd: PACKAGE_ROOT, stdio: "pipe" });
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-doc-example-"));
  // The page's sample uses the default deployment: this nats-server is the test's own.
  env = { GYM_CKPT_NATS_URL: nats.server.url, GYM_CKPT_TOKEN: TOKEN, GYM_CKPT_CHECKPOINT_ROOT: root };
  daemon = spawnDaemon([MAIN, "coordinator", "--nats-url", nats.server.url, "--token", TOKEN, "--checkpoint-root", root, "--lease-ms", "500", "--no-http", "--log-level", "warn"]);
}, 120_000);
afterEach(async () => {
  await Promise.all([...servers].map(stopServer));
});
afterAll(async () => {
  await daemon?.kill();
  await nats?.close();
  if (root) await rm(root, { recursive: true, force: true });
  rmSync(WORK, { recursive: true, force: true });
});

async function stopServer(child: ChildProcess): Promise<void> {
  if (child.exitCode === null && child.signalCode === null) {
    const exited = new Promise((resolve) => child.once("exit", resolve));
    child.kill("SIGKILL");
    await exited;
  }
  servers.delete(child);
}

/** Starts the page's server and resolves with the URL it prints once it takes part in checkpoints. */
async function startCalculator(): Promise<{ child: ChildProcess; url: string }> {
  const child = spawn(process.execPath, [join(WORK, "calculator.js")], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  servers.add(child);
  let out = "";
  let err = "";
  child.stdout!.on("data", (d: Buffer) => (out += d.toString()));
  child.stderr!.on("data", (d: Buffer) => (err += d.toString()));
  const url = () => /(http:\/\/127\.0\.0\.1:\d+)/.exec(out)?.[1];
  await waitUntil(() => url() !== undefined || child.exitCode !== null, "the sample's URL on its stdout");
  if (!url()) throw new Error(`the sample exited ${child.exitCode} without printing its URL: ${err}`);
  return { child, url: url()! };
}

describe("docs/resources.md: the sample server, run", () => {
  it("takes part in a checkpoint, and after a SIGKILL its restored session works as attempt 1", { timeout: 90_000 }, async () => {
    const first = await startCalculator();
    const seed = await postRollout(first.url, "r1", "/seed_session");
    expect(seed.status).toBe(200);
    const cookie = seed.cookie!;
    expect((await postRollout(first.url, "r1", "/tools/calculator", cookie)).body).toEqual({ result: "42" });

    const checkpoint = await cli(["checkpoint", "--id", "doc-1", "--episodes", "r1", "--json"], env);
    expect([checkpoint.code, checkpoint.stderr]).toEqual([0, ""]);
    expect(JSON.parse(checkpoint.stdout)).toMatchObject({ checkpoint_id: "doc-1", participants: 1 });

    await stopServer(first.child);
    const fresh = await startCalculator();
    const restore = await cli(["restore", "doc-1", "--episodes", "r1"], env);
    expect([restore.code, restore.stderr]).toEqual([0, ""]);
    expect(JSON.parse(restore.stdout).participants).toEqual([{ kind: "resources", instance: "calculator", restored: ["r1-a1"] }]);
    expect((await cli(["resume", "doc-1"], env)).code).toBe(0);

    // The stateless session came back under attempt 1: its cookie works there, not for attempt 0.
    expect(await postRollout(fresh.url, "r1-a1", "/tools/calculator", cookie)).toMatchObject({ status: 200, body: { result: "42" } });
    expect((await postRollout(fresh.url, "r1", "/tools/calculator", cookie)).body.error.code).toBe("stale_attempt");
    expect(await postRollout(fresh.url, "r1-a1", "/verify", cookie)).toMatchObject({ status: 200, body: { reward: 1 } });
  });
});
