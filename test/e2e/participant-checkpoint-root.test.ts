import { mkdir, mkdtemp, readdir, rm, symlink } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { launchGym, type Gym } from "../../participants/gym/gym-launcher.js";
import { controlRequest, phase } from "../support/control-requests.js";
import { startNats, type NatsFixture } from "../support/nats.js";

/**
 * The reference environment server (dist/) started with --checkpoint-root: a checkpoint_dir that
 * lies in the root textually but reaches out of it through a symlink, at checkpoint_dir itself or
 * below it (`<checkpoint_dir>/gym`), is refused with invalid_request and nothing is written outside.
 */
const TOKEN = "ckpt-root-token";
const deployment = `ckptroot${process.pid}`;
let nats: NatsFixture;
let gym: Gym | undefined;
let root: string;
let outside: string;

beforeAll(async () => {
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-root-"));
  outside = await mkdtemp(join(tmpdir(), "gym-ckpt-outside-"));
  const nowhere = "http://127.0.0.1:9"; // only the environment server runs; nothing calls these
  gym = await launchGym({
    nats: nats.server.url,
    deployment,
    token: TOKEN,
    checkpointRoot: root,
    external: { policy: nowhere, model: nowhere, resources: nowhere, agent: nowhere },
    initial: ["environment"],
  });
}, 60_000);

afterAll(async () => {
  await gym?.stop();
  await nats?.close();
  if (root) await rm(root, { recursive: true, force: true });
  if (outside) await rm(outside, { recursive: true, force: true });
});

describe("environment server with --checkpoint-root", () => {
  it("refuses a commit whose checkpoint_dir, or <checkpoint_dir>/gym, is a symlink out of the root, and writes nothing outside", async () => {
    const target = { deployment, kind: "environment" as const, instance: gym!.instances.environment, token: TOKEN };
    const commit = (dir: string) => controlRequest(nats.nc, target, "commit", phase("c1", { checkpoint_dir: dir, episode_ids: null, stop: false }));
    expect((await controlRequest(nats.nc, target, "prepare", phase("c1"))).phase).toBe("prepared");
    await symlink(outside, join(root, "escape"));
    await mkdir(join(root, "c1"));
    await symlink(outside, join(root, "c1", "gym"));
    const codes = [(await commit(join(root, "escape", "c1"))).error?.code, (await commit(join(root, "c1"))).error?.code];
    const leaked = await readdir(outside);
    expect((await controlRequest(nats.nc, target, "resume", phase("c1"))).phase).toBe("idle");
    expect({ codes, leaked }).toEqual({ codes: ["invalid_request", "invalid_request"], leaked: [] });
  });
});
