import { execFileSync } from "node:child_process";
import { appendFile, cp, mkdir, mkdtemp, readdir, readFile, rm, symlink, unlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CONTROLLER_TOKEN, startWorld, type World } from "../integration/coordinator-harness.js";
import { cli, daemonArgs, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * `gym-ckpt verify` (the built binary) against copies of one real checkpoint (a daemon, five
 * participants over NATS, three records and a controller state file), each damaged one way: every
 * damage exits 1 naming the catalog code, and a FIFO never blocks it.
 */

let world: World;
let daemon: DaemonProcess;
const copies: string[] = [];

beforeAll(async () => {
  ensureBuilt();
  world = await startWorld();
  await world.startParticipants();
  for (const r of ["a", "b", "c"]) world.participant("policy").adapter.addEpisode({ rollout_id: r, attempt: 0 }, { t: 1 });
  daemon = spawnDaemon(daemonArgs(world, ["--http-port", "0"]));
  const env = { GYM_CKPT_NATS_URL: world.nats.server.url, GYM_CKPT_DEPLOYMENT: world.deployment, GYM_CKPT_CONTROLLER_TOKEN: CONTROLLER_TOKEN, GYM_CKPT_CHECKPOINT_ROOT: world.root };
  // The controller writes its state file into the checkpoint directory before the checkpoint names it.
  await mkdir(join(world.root, "v-1"));
  await writeFile(join(world.root, "v-1", "state.json"), '{"step":1}\n');
  const checkpoint = await cli(["checkpoint", "--id", "v-1", "--state-file", "state.json"], env);
  expect([checkpoint.code, checkpoint.stderr]).toEqual([0, ""]);
});
afterAll(async () => {
  await daemon?.kill();
  await world?.close();
  await Promise.all(copies.map((d) => rm(d, { recursive: true, force: true })));
});

/** A copy of the real root (the checkpoint and LATEST), damaged by `damage`, then verified. */
async function verifyDamaged(damage: (root: string, dir: string) => Promise<void>, target = "v-1") {
  const root = await mkdtemp(join(tmpdir(), "gym-ckpt-verify-"));
  copies.push(root);
  await cp(join(world.root, "v-1"), join(root, "v-1"), { recursive: true });
  await cp(join(world.root, "LATEST"), join(root, "LATEST"));
  await damage(root, join(root, "v-1"));
  const result = await cli(["verify", target, "--root", root]);
  return { ...result, root };
}

const policyDir = (dir: string) => join(dir, "gym", "model", "policy");
const recordsOf = async (dir: string) => join(policyDir(dir), (await readdir(policyDir(dir))).find((n) => n.startsWith("records-"))!);
const rewrite = async (path: string, edit: (text: string) => string) => writeFile(path, edit(await readFile(path, "utf8")));
const refusal = (code: string, detail: RegExp) => ({ code: 1, stdout: "", stderr: expect.stringMatching(new RegExp(`^error ${code}: ${detail.source}\\n$`)) as unknown });

describe("gym-ckpt verify of a damaged checkpoint", () => {
  it("an intact copy verifies", async () => {
    const { code, stdout, stderr } = await verifyDamaged(async () => {});
    expect({ code, stdout, stderr }).toEqual({ code: 0, stdout: "ok v-1: 5 participants, 3 records, 186 bytes\n", stderr: "" });
  });

  it("records truncated, extended, or a line changed with the count kept: invalid_checkpoint_state naming the participant", { timeout: 30_000 }, async () => {
    const cases: [string, (root: string, dir: string) => Promise<void>, RegExp][] = [
      ["a whole line cut", async (_r, d) => rewrite(await recordsOf(d), (t) => t.split("\n").slice(0, 2).join("\n") + "\n"), /model\/policy: records digest [0-9a-f]{64} does not match [0-9a-f]{64}/],
      ["cut mid-line", async (_r, d) => rewrite(await recordsOf(d), (t) => t.slice(0, -5)), /model\/policy: line 3 is not JSON/],
      ["a line appended", async (_r, d) => appendFile(await recordsOf(d), '{"episode_id":{"rollout_id":"zz","attempt":0}}\n'), /model\/policy: records digest [0-9a-f]{64} does not match [0-9a-f]{64}/],
      ["a line changed, count kept", async (_r, d) => rewrite(await recordsOf(d), (t) => t.replace('"rollout_id":"b"', '"rollout_id":"q"')), /model\/policy: records digest [0-9a-f]{64} does not match [0-9a-f]{64}/],
      ["the records file gone", async (_r, d) => unlink(await recordsOf(d)), /model\/policy: cannot read .*ENOENT.*/],
    ];
    for (const [, damage, detail] of cases) expect(await verifyDamaged(damage)).toMatchObject(refusal("invalid_checkpoint_state", detail));
  });

  it("a manifest whose digest differs from checkpoint.json's, a participant directory missing or extra", { timeout: 30_000 }, async () => {
    const cases: [(root: string, dir: string) => Promise<void>, RegExp][] = [
      [async (_r, d) => appendFile(join(policyDir(d), "manifest.json"), " "), /model\/policy: manifest digest does not match checkpoint.json/],
      [async (_r, d) => rm(policyDir(d), { recursive: true }), /model\/policy: its directory gym\/model\/policy is missing/],
      [async (_r, d) => cp(policyDir(d), join(d, "gym", "model", "policy2"), { recursive: true }), /gym\/model\/policy2 holds a participant's files that checkpoint.json does not list/],
    ];
    for (const [damage, detail] of cases) expect(await verifyDamaged(damage)).toMatchObject(refusal("invalid_checkpoint_state", detail));
  });

  it("a records file replaced by a symbolic link or a FIFO is refused at once", { timeout: 30_000 }, async () => {
    const linked = await verifyDamaged(async (root, dir) => {
      const records = await recordsOf(dir);
      await cp(records, join(root, "outside.jsonl"));
      await unlink(records);
      await symlink(join(root, "outside.jsonl"), records);
    });
    expect(linked).toMatchObject(refusal("invalid_checkpoint_state", /.*\/gym\/model\/policy\/records-[0-9a-f]{64}\.jsonl is a symbolic link/));
    const fifo = await verifyDamaged(async (_root, dir) => {
      const records = await recordsOf(dir);
      await unlink(records);
      execFileSync("mkfifo", [records]);
    });
    expect(fifo).toMatchObject(refusal("invalid_checkpoint_state", /.*\/gym\/model\/policy\/records-[0-9a-f]{64}\.jsonl is not a regular file/));
  });

  it("a checkpoint.json with unknown fields, at the top or in an entry", { timeout: 30_000 }, async () => {
    const withField = (edit: (j: { participants: Record<string, unknown>[] } & Record<string, unknown>) => void) => async (_r: string, d: string) =>
      rewrite(join(d, "checkpoint.json"), (t) => {
        const j = JSON.parse(t) as { participants: Record<string, unknown>[] } & Record<string, unknown>;
        edit(j);
        return JSON.stringify(j);
      });
    expect(await verifyDamaged(withField((j) => (j.extra = 1)))).toMatchObject(refusal("invalid_checkpoint_state", /.*\/v-1\/checkpoint.json is invalid: \(root\): Unrecognized key: "extra"/));
    expect(await verifyDamaged(withField((j) => (j.participants[0]!.extra = 1)))).toMatchObject(refusal("invalid_checkpoint_state", /.*\/v-1\/checkpoint.json is invalid: participants.0: Unrecognized key: "extra"/));
  });

  it("a controller state file changed, gone or a FIFO", { timeout: 30_000 }, async () => {
    expect(await verifyDamaged(async (_r, d) => writeFile(join(d, "state.json"), '{"step":2}\n'))).toMatchObject(
      refusal("invalid_checkpoint_state", /controller state file state.json digest does not match checkpoint.json/),
    );
    expect(await verifyDamaged(async (_r, d) => unlink(join(d, "state.json")))).toMatchObject(refusal("invalid_checkpoint_state", /controller state file state.json is missing/));
    const fifo = await verifyDamaged(async (_r, d) => {
      await unlink(join(d, "state.json"));
      execFileSync("mkfifo", [join(d, "state.json")]);
    });
    expect(fifo).toMatchObject(refusal("invalid_checkpoint_state", /.*\/v-1\/state.json is not a regular file/));
  });

  it("a checkpoint.json replaced by a symbolic link out of the checkpoint is refused, as its other files are", async () => {
    const linked = await verifyDamaged(async (root, dir) => {
      await cp(join(dir, "checkpoint.json"), join(root, "elsewhere.json"));
      await unlink(join(dir, "checkpoint.json"));
      await symlink(join(root, "elsewhere.json"), join(dir, "checkpoint.json"));
    });
    expect(linked).toMatchObject(refusal("invalid_checkpoint_state", /.*\/v-1\/checkpoint.json is a symbolic link/));
    // ls does not list it either, and names it.
    const ls = await cli(["ls", "--root", linked.root]);
    expect(ls).toEqual({ code: 0, stdout: "", stderr: expect.stringMatching(/^warning invalid_checkpoint_state: checkpoint v-1 is not listed: .*checkpoint.json is a symbolic link\n/) });
  });

  it("verify LATEST when LATEST names a checkpoint that is missing or partial: not_found naming LATEST", { timeout: 30_000 }, async () => {
    const missing = await verifyDamaged(async (root) => writeFile(join(root, "LATEST"), "gone\n"), "LATEST");
    expect(missing).toMatchObject(refusal("not_found", /LATEST names checkpoint gone, which is not published under .*/));
    const partial = await verifyDamaged(async (root) => {
      await mkdir(join(root, "part", "gym"), { recursive: true });
      await writeFile(join(root, "LATEST"), "part\n");
    }, "LATEST");
    expect(partial).toMatchObject(refusal("not_found", /LATEST names checkpoint part, which is not published under .*/));
    const fifo = await verifyDamaged(async (root) => {
      await unlink(join(root, "LATEST"));
      execFileSync("mkfifo", [join(root, "LATEST")]);
    }, "LATEST");
    expect(fifo).toMatchObject(refusal("invalid_checkpoint_state", /.*\/LATEST is not a regular file/));
  });
});
