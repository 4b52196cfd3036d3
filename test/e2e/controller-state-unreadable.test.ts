import { spawnSync } from "node:child_process";
import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../coordinator/publication/global-manifest-writer.js";
import { writeParticipant } from "../unit/coordinator/fake-participants.js";
import { asAccount, ensureBuilt } from "./coordinator-process.js";

/**
 * A controller state file the coordinator's account cannot read (EACCES: it is there) is the
 * storage's refusal, `storage_error`, not `not_found` ("not in the checkpoint directory", which
 * tells the controller to put it there and retry). Root reads through mode bits, so the check runs
 * in a node process as another account (setpriv), against the built publication code.
 */
const asRoot = process.getuid?.() === 0;
let shared: string;

beforeAll(async () => {
  ensureBuilt();
  shared = await mkdtemp("/tmp/gym-ckpt-state-eacces-");
  await chmod(shared, 0o755);
});
afterAll(async () => {
  if (shared) await rm(shared, { recursive: true, force: true });
});

/** Runs `call` (an expression over `w`, the writer, and `catalog`) in node as another account; its refusal's code and detail. */
function asOtherAccount(root: string, call: string): { code: string; detail: string } {
  const writer = pathToFileURL(resolve("dist/coordinator/publication/global-manifest-writer.js")).href;
  const catalog = pathToFileURL(resolve("dist/coordinator/publication/checkpoint-catalog.js")).href;
  const protocol = pathToFileURL(resolve("dist/protocol/index.js")).href;
  const verify = pathToFileURL(resolve("dist/coordinator/publication/verify-checkpoint.js")).href;
  const script = [
    `const { GlobalManifestWriter } = await import(${JSON.stringify(writer)});`,
    `const { CheckpointCatalog } = await import(${JSON.stringify(catalog)});`,
    `const { toCheckpointError } = await import(${JSON.stringify(protocol)});`,
    `const { verifyCheckpoint } = await import(${JSON.stringify(verify)});`,
    `const catalog = new CheckpointCatalog(${JSON.stringify(root)});`,
    `const w = new GlobalManifestWriter(catalog, 2);`,
    `const r = await (${call}).then(() => ({ code: "ok", detail: "" }), (e) => { const c = toCheckpointError(e); return { code: c.code, detail: c.message }; });`,
    `process.stdout.write(JSON.stringify(r));`,
  ].join("\n");
  const [command, ...args] = [...asAccount({ uid: 64_992, gid: 64_992, umask: 0o022 }), process.execPath, "--input-type=module", "-e", script];
  const run = spawnSync(command!, args, { encoding: "utf8", cwd: "/" });
  if (run.status !== 0) throw new Error(run.stderr);
  return JSON.parse(run.stdout) as { code: string; detail: string };
}

const checkAsOtherAccount = (root: string, input: unknown) => asOtherAccount(root, `w.checkControllerState("c1", ${JSON.stringify(input)})`);

describe.skipIf(!asRoot)("controller state file the coordinator cannot read", () => {
  it("is storage_error naming it (EACCES), while a missing one is still not_found", async () => {
    const root = join(shared, "root");
    await mkdir(join(root, "c1"), { recursive: true, mode: 0o755 });
    await chmod(root, 0o755);
    await chmod(join(root, "c1"), 0o755);
    await writeFile(join(root, "c1", "state.json"), "{}", { mode: 0o600 }); // root's own, unreadable by 64992
    expect(checkAsOtherAccount(root, { file: "missing.json" })).toMatchObject({ code: "not_found" });
    const refused = checkAsOtherAccount(root, { file: "state.json" });
    expect(refused.code, refused.detail).toBe("storage_error");
    expect(refused.detail).toMatch(/^EACCES: .*state\.json/);
  });

  it("verify of a published checkpoint whose state file it cannot read is storage_error, not 'is missing'", async () => {
    const root = join(shared, "verify-root");
    await mkdir(root, { recursive: true, mode: 0o755 });
    await chmod(root, 0o755);
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    writer.stage("c2");
    await mkdir(join(root, "c2"), { recursive: true });
    await chmod(join(root, "c2"), 0o755);
    await writeFile(join(root, "c2", "state.json"), "{}", { mode: 0o600 }); // root's own, unreadable by 64992
    await writer.publish({ checkpointId: "c2", epoch: 1, preparedAt: 1, publishedAt: 2, stop: false, scope: null, restarts: [], participants: [], controllerState: { file: "state.json" } });
    await chmod(join(root, "c2", "checkpoint.json"), 0o644);
    await chmod(join(root, "LATEST"), 0o644);
    const refused = asOtherAccount(root, `verifyCheckpoint(catalog, "c2")`);
    expect(refused.code, refused.detail).toBe("storage_error");
    expect(refused.detail).toMatch(/^EACCES: .*state\.json/);
  });

  it("verify of a checkpoint whose participant files it cannot read is storage_error, not a corrupt or missing manifest", async () => {
    const root = join(shared, "verify-participant-root");
    await mkdir(root, { recursive: true, mode: 0o755 });
    await chmod(root, 0o755);
    const catalog = new CheckpointCatalog(root);
    const writer = new GlobalManifestWriter(catalog, 2);
    const entry = await writeParticipant(root, "c3", "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
    await writer.publish({ checkpointId: "c3", epoch: 1, preparedAt: 1, publishedAt: 2, stop: false, scope: null, restarts: [], participants: [entry], controllerState: null });
    const dir = join(root, "c3", "gym", "agent", "a1");
    for (const d of [join(root, "c3"), join(root, "c3", "gym"), join(root, "c3", "gym", "agent"), dir]) await chmod(d, 0o755);
    await chmod(join(root, "c3", "checkpoint.json"), 0o644);
    await chmod(join(root, "LATEST"), 0o644);
    expect(asOtherAccount(root, `verifyCheckpoint(catalog, "c3")`)).toMatchObject({ code: "ok" });
    // A participant that wrote with umask 0077: its records file, then its manifest, then its directory.
    const records = join(dir, `records-${entry.records_sha256}.jsonl`);
    await chmod(records, 0o600);
    let refused = asOtherAccount(root, `verifyCheckpoint(catalog, "c3")`);
    expect(refused.code, refused.detail).toBe("storage_error");
    expect(refused.detail).toMatch(/^EACCES: .*records-/);
    await chmod(join(dir, "manifest.json"), 0o600);
    refused = asOtherAccount(root, `verifyCheckpoint(catalog, "c3")`);
    expect(refused.code, refused.detail).toBe("storage_error");
    expect(refused.detail).toMatch(/^EACCES: .*manifest\.json/);
    await chmod(dir, 0o700);
    refused = asOtherAccount(root, `verifyCheckpoint(catalog, "c3")`);
    expect(refused.code, refused.detail).toBe("storage_error");
    expect(refused.detail).toMatch(/^EACCES: /);
  });
});
