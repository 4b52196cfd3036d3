import { spawnSync } from "node:child_process";
import { chmod, mkdtemp, readFile, rename, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../coordinator/publication/global-manifest-writer.js";
import { writeParticipant } from "../unit/coordinator/fake-participants.js";
import { MAIN, asAccount, cli, ensureBuilt } from "./coordinator-process.js";

/** `gym-ckpt ls` on odd checkpoint roots, against what docs/api.md §4 promises. */
let root: string;
beforeAll(() => ensureBuilt());
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-odd-root-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

async function publish(ids: string[]): Promise<void> {
  const catalog = new CheckpointCatalog(root);
  const writer = new GlobalManifestWriter(catalog, 5);
  let t = 2;
  for (const id of ids) {
    const entry = await writeParticipant(root, id, "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
    await writer.publish({ checkpointId: id, epoch: 1, preparedAt: 1, publishedAt: t++, stop: false, scope: null, restarts: [], participants: [entry], controllerState: null });
  }
  await writer.settled();
}

describe("gym-ckpt ls on odd inputs", () => {
  it("a --root below a regular file is a catalog refusal (not_found / invalid_request), not internal_error", async () => {
    await writeFile(join(root, "afile"), "x");
    const ls = await cli(["ls", "--root", join(root, "afile", "sub")]);
    // docs/api.md: `not_found` (exit 1) when DIR does not exist; a non-directory is invalid_request (exit 2).
    expect(ls.stderr).not.toMatch(/internal_error/);
    expect(ls.stderr).toMatch(/^error (not_found|invalid_request): /);
  });

  it("a --root that is a loop of symbolic links is invalid_request (exit 2) for ls and verify, as the daemon refuses it, not internal_error", async () => {
    await symlink(join(root, "loop-b"), join(root, "loop-a"));
    await symlink(join(root, "loop-a"), join(root, "loop-b"));
    for (const dir of [join(root, "loop-a"), join(root, "loop-a", "sub")]) {
      const refused = { code: 2, stdout: "", stderr: expect.stringMatching(new RegExp(`^error invalid_request: checkpoint root ${dir} is not a directory \\(ELOOP: [^\\n]*\\)\\n$`)) };
      expect(await cli(["ls", "--root", dir])).toEqual(refused);
      expect(await cli(["verify", "LATEST", "--root", dir])).toEqual(refused);
      expect(await cli(["verify", "c1", "--root", dir, "--json"])).toEqual(refused);
    }
  });

  it("a LATEST naming a checkpoint whose checkpoint.json is damaged is reported, not silently unmarked", async () => {
    await publish(["c1", "c2"]); // LATEST = c2
    await writeFile(join(root, "c2", "checkpoint.json"), '{"schema_version":');
    const ls = await cli(["ls", "--root", root, "--json"]);
    expect(ls.code).toBe(0);
    const out = JSON.parse(ls.stdout) as { latest: string | null; latest_error?: unknown; checkpoints: { checkpoint_id: string }[] };
    expect(out.checkpoints.map((c) => c.checkpoint_id)).toEqual(["c1"]);
    // LATEST must not name a checkpoint the listing lacks without saying why (docs/api.md, ls).
    expect(ls.stderr).toMatch(/^warning invalid_checkpoint_state: /);
    expect(out.latest).toBeNull();
    expect(out.latest_error).toMatchObject({ code: "invalid_checkpoint_state" });
  });

  it("a checkpoint whose checkpoint.json is damaged is named with a warning (and under `damaged` in --json), not silently left out", async () => {
    await publish(["c1", "c2"]); // LATEST = c2, intact
    await writeFile(join(root, "c1", "checkpoint.json"), '{"schema_version":');
    const ls = await cli(["ls", "--root", root]);
    expect(ls.code).toBe(0);
    expect(ls.stdout).toMatch(/^\* c2 [^\n]*\n$/);
    expect(ls.stderr).toMatch(/^warning invalid_checkpoint_state: checkpoint c1 is not listed: [^\n]+\n$/);
    const json = JSON.parse((await cli(["ls", "--root", root, "--json"])).stdout) as { latest: string; checkpoints: { checkpoint_id: string }[]; damaged: { checkpoint_id: string; code: string }[] };
    expect(json.latest).toBe("c2");
    expect(json.checkpoints.map((c) => c.checkpoint_id)).toEqual(["c2"]);
    expect(json.damaged).toEqual([{ checkpoint_id: "c1", code: "invalid_checkpoint_state", detail: expect.any(String) }]);
  });

  it("a checkpoint directory that is a symbolic link is named with a warning, as docs/api.md promises (verify refuses it), and retention leaves it", async () => {
    await publish(["c1", "c2"]); // LATEST = c2
    const outside = await mkdtemp(join(tmpdir(), "gym-ckpt-odd-root-outside-"));
    try {
      await rename(join(root, "c1"), join(outside, "c1"));
      await symlink(join(outside, "c1"), join(root, "c1"));
      // A link to a directory that holds no checkpoint.json is not a checkpoint: not named.
      await symlink(tmpdir(), join(root, "elsewhere"));
      const ls = await cli(["ls", "--root", root]);
      expect(ls).toEqual({ code: 0, stdout: expect.stringMatching(/^\* c2 [^\n]*\n$/), stderr: `warning invalid_checkpoint_state: checkpoint c1 is not listed: checkpoint directory ${join(root, "c1")} is a symbolic link, not a checkpoint this root holds\n` });
      const json = JSON.parse((await cli(["ls", "--root", root, "--json"])).stdout) as { damaged: { checkpoint_id: string; code: string }[] };
      expect(json.damaged).toEqual([{ checkpoint_id: "c1", code: "invalid_checkpoint_state", detail: expect.stringContaining("is a symbolic link") }]);
      // Neither listed nor deleted: retention after another publication keeps the link and its target.
      const catalog = new CheckpointCatalog(root);
      const writer = new GlobalManifestWriter(catalog, 1);
      const entry = await writeParticipant(root, "c3", "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
      await writer.publish({ checkpointId: "c3", epoch: 1, preparedAt: 1, publishedAt: 9, stop: false, scope: null, restarts: [], participants: [entry], controllerState: null });
      expect(writer.retain("c3")).toEqual(["c2"]);
      await writer.settled();
      expect(catalog.scan().damaged.map((d) => d.checkpoint_id)).toEqual(["c1"]);
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });

  it("a checkpoint.json whose published_at no date can show still lists every checkpoint (the raw value), not internal_error", async () => {
    await publish(["c1", "c2"]);
    const path = join(root, "c1", "checkpoint.json");
    await writeFile(path, JSON.stringify({ ...JSON.parse(await readFile(path, "utf8")), published_at: 1e13 }));
    const ls = await cli(["ls", "--root", root]);
    expect(ls).toEqual({ code: 0, stdout: expect.stringMatching(/^  c1  published_at 10000000000000  epoch 1[^\n]*\n\* c2  1970-01-01T00:00:03\.000Z  epoch 1[^\n]*\n$/), stderr: "" });
  });

  // Root reads through mode bits: the listing runs as another account (setpriv).
  it.skipIf(process.getuid?.() !== 0)("a LATEST this account cannot read (EACCES) still lists every checkpoint, with a warning", async () => {
    const shared = await mkdtemp("/tmp/gym-ckpt-ls-eacces-");
    const own = root;
    try {
      root = shared; // reachable by the other account, unlike the test run's TMPDIR
      await chmod(root, 0o755);
      await publish(["c1", "c2"]);
      for (const id of ["c1", "c2"]) {
        await chmod(join(root, id), 0o755);
        await chmod(join(root, id, "checkpoint.json"), 0o644);
      }
      await chmod(join(root, "LATEST"), 0o600);
      const [command, ...args] = [...asAccount({ uid: 64_993, gid: 64_993, umask: 0o022 }), process.execPath, MAIN, "ls", "--root", root, "--json"];
      const ls = spawnSync(command!, args, { encoding: "utf8", cwd: process.cwd() });
      expect(ls.status, ls.stderr).toBe(0);
      const out = JSON.parse(ls.stdout) as { latest: string | null; latest_error?: { code: string }; checkpoints: { checkpoint_id: string }[] };
      expect(out.checkpoints.map((c) => c.checkpoint_id)).toEqual(["c2", "c1"]);
      expect(out.latest).toBeNull();
      expect(out.latest_error).toMatchObject({ code: "storage_error" });
      expect(ls.stderr).toMatch(/^warning storage_error: EACCES/);
    } finally {
      root = own;
      await rm(shared, { recursive: true, force: true });
    }
  });

  // docs/api.md: a root this account cannot reach is invalid_request (exit 2), for ls and verify
  // alike; exit 1 from verify tells an operator to restore an older checkpoint.
  it.skipIf(process.getuid?.() !== 0)("a root whose own mode shuts this account out is invalid_request (exit 2) for ls and verify, not storage_error", async () => {
    const shared = await mkdtemp("/tmp/gym-ckpt-ls-eacces-");
    const own = root;
    try {
      root = shared;
      await publish(["c1"]);
      await chmod(root, 0o700); // owned by root: the other account cannot list or enter it
      const as = (...cliArgs: string[]) => {
        const [command, ...args] = [...asAccount({ uid: 64_993, gid: 64_993, umask: 0o022 }), process.execPath, MAIN, ...cliArgs];
        const r = spawnSync(command!, args, { encoding: "utf8", cwd: process.cwd() });
        return { code: r.status, stdout: r.stdout, stderr: r.stderr };
      };
      const refused = { code: 2, stdout: "", stderr: `error invalid_request: checkpoint root ${root} is not accessible to this account (EACCES)\n` };
      expect(as("ls", "--root", root)).toEqual(refused);
      expect(as("verify", "LATEST", "--root", root)).toEqual(refused);
      expect(as("verify", "c1", "--root", root)).toEqual(refused);
    } finally {
      root = own;
      await rm(shared, { recursive: true, force: true });
    }
  });
});
