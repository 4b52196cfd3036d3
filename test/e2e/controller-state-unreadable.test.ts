import { spawnSync } from "node:child_process";
import { chmod, mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { join, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
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

function checkAsOtherAccount(root: string, input: unknown): { code: string; detail: string } {
  const writer = pathToFileURL(resolve("dist/coordinator/publication/global-manifest-writer.js")).href;
  const catalog = pathToFileURL(resolve("dist/coordinator/publication/checkpoint-catalog.js")).href;
  const protocol = pathToFileURL(resolve("dist/protocol/index.js")).href;
  const script = [
    `const { GlobalManifestWriter } = await import(${JSON.stringify(writer)});`,
    `const { CheckpointCatalog } = await import(${JSON.stringify(catalog)});`,
    `const { toCheckpointError } = await import(${JSON.stringify(protocol)});`,
    `const w = new GlobalManifestWriter(new CheckpointCatalog(${JSON.stringify(root)}), 2);`,
    `const r = await w.checkControllerState("c1", ${JSON.stringify(input)}).then(() => ({ code: "ok", detail: "" }), (e) => { const c = toCheckpointError(e); return { code: c.code, detail: c.message }; });`,
    `process.stdout.write(JSON.stringify(r));`,
  ].join("\n");
  const [command, ...args] = [...asAccount({ uid: 64_992, gid: 64_992, umask: 0o022 }), process.execPath, "--input-type=module", "-e", script];
  const run = spawnSync(command!, args, { encoding: "utf8", cwd: "/" });
  if (run.status !== 0) throw new Error(run.stderr);
  return JSON.parse(run.stdout) as { code: string; detail: string };
}

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
});
