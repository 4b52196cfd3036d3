import { spawnSync } from "node:child_process";
import { mkdtemp, rm, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { launchGym, type Gym } from "../../participants/gym/gym-launcher.js";
import { controlRequest, phase } from "../support/control-requests.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { ensureBuilt } from "./coordinator-process.js";
import { PROXY_ENTRY, commonArgs } from "./model-processes.js";

/**
 * Node 20's recursive mkdir loops for ever where mkdir(2) answers ENOENT under an existing parent
 * (any path under /proc): a participant program (dist/) given such a directory must answer at once,
 * not spin silently. Every wait is bounded: a spin fails the test instead of hanging it.
 */
const TOKEN = "proc-dirs-token";
const deployment = `procdirs${process.pid}`;
const underProc = `/proc/gym-ckpt-${process.pid}`;
let nats: NatsFixture;
let gym: Gym | undefined;

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
}, 60_000);

afterAll(async () => {
  await gym?.stop();
  await nats?.close();
});

describe("participant directories that cannot exist (under /proc)", () => {
  it("the attach proxy refuses --ledger-dir at start-up (invalid_request, exit 2) instead of spinning", () => {
    const ledgerDir = `${underProc}/ledger`;
    const args = commonArgs(nats.server.url, deployment, "procledger", TOKEN, ["--upstream", "http://127.0.0.1:9/v1", "--ledger-dir", ledgerDir]);
    // A proxy that spins (or serves) is killed after 10 s: status null.
    const run = spawnSync(process.execPath, [PROXY_ENTRY, ...args], { encoding: "utf8", timeout: 10_000, killSignal: "SIGKILL" });
    expect({ status: run.status, ready: run.stdout.includes('"ready":true') }, run.stderr).toEqual({ status: 2, ready: false });
    expect(run.stderr).toMatch(new RegExp(`^attach model: invalid_request: --ledger-dir ${ledgerDir} cannot be created \\(ENOENT: `, "m"));
  }, 20_000);

  it("the attach proxy refuses a --ledger-dir through a symbolic-link loop (ELOOP) with invalid_request, exit 2, not a stack trace", async () => {
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-ledger-loop-"));
    try {
      await symlink(join(dir, "loop"), join(dir, "loop"));
      const ledgerDir = join(dir, "loop", "ledger");
      const args = commonArgs(nats.server.url, deployment, "loopledger", TOKEN, ["--upstream", "http://127.0.0.1:9/v1", "--ledger-dir", ledgerDir]);
      const run = spawnSync(process.execPath, [PROXY_ENTRY, ...args], { encoding: "utf8", timeout: 10_000, killSignal: "SIGKILL" });
      expect({ status: run.status, ready: run.stdout.includes('"ready":true') }, run.stderr).toEqual({ status: 2, ready: false });
      expect(run.stderr).toMatch(new RegExp(`^attach model: invalid_request: --ledger-dir ${ledgerDir} cannot be created \\(ELOOP: `, "m"));
      expect(run.stderr).not.toMatch(/^\s+at /m); // no stack trace
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  }, 20_000);

  it("an environment server whose checkpoint directory lies under /proc refuses the commit at once and resumes", async () => {
    // The root exists (a missing root is refused before any mkdir); the directory below it cannot.
    const root = "/proc";
    const nowhere = "http://127.0.0.1:9"; // only the environment server runs; nothing calls these
    gym = await launchGym({
      nats: nats.server.url,
      deployment,
      token: TOKEN,
      checkpointRoot: root,
      external: { policy: nowhere, model: nowhere, resources: nowhere, agent: nowhere },
      initial: ["environment"],
    });
    const target = { deployment, kind: "environment" as const, instance: gym.instances.environment, token: TOKEN };
    expect((await controlRequest(nats.nc, target, "prepare", phase("c1"))).phase).toBe("prepared");
    // The commit's deadline is 30 s away: a write spinning in mkdir would leave this request unanswered (5 s timeout).
    const commit = await controlRequest(nats.nc, target, "commit", phase("c1", { checkpoint_dir: `${underProc}/c1`, episode_ids: null, stop: false }), 5_000);
    expect(commit.error?.code).toBe("storage_error");
    // Refused before any mkdir: no coordinator could have made a checkpoint directory there.
    expect(commit.error?.detail).toMatch(new RegExp(`^ENOENT: checkpoint directory ${underProc}/c1`));
    expect((await controlRequest(nats.nc, target, "resume", phase("c1"), 5_000)).phase).toBe("idle");
  }, 60_000);
});
