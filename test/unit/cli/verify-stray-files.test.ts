import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Command } from "commander";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { register } from "../../../coordinator/cli/commands/verify.js";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";
import { writeParticipant } from "../coordinator/fake-participants.js";

/**
 * `gym-ckpt verify` in process, over a checkpoint whose participant directory holds files no
 * manifest names: it verifies (exit 0, the `ok` line), and names each on stderr as a warning.
 */
let root: string;
let stdout: string;
let stderr: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-verify-cli-"));
  stdout = "";
  stderr = "";
  vi.spyOn(process.stdout, "write").mockImplementation((chunk: string | Uint8Array) => ((stdout += String(chunk)), true));
  vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => ((stderr += String(chunk)), true));
  process.exitCode = undefined;
});
afterEach(async () => {
  vi.restoreAllMocks();
  process.exitCode = undefined;
  await rm(root, { recursive: true, force: true });
});

async function verify(...args: string[]): Promise<number> {
  const program = new Command().exitOverride();
  register(program);
  await program.parseAsync(["verify", ...args, "--root", root], { from: "user" });
  return Number(process.exitCode ?? 0);
}

describe("gym-ckpt verify of a checkpoint with files no manifest names", () => {
  beforeEach(async () => {
    const entry = await writeParticipant(root, "c1", "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
    const writer = new GlobalManifestWriter(new CheckpointCatalog(root), 5);
    await writer.publish({ checkpointId: "c1", epoch: 1, preparedAt: 1, publishedAt: 2, stop: false, scope: null, restarts: [], participants: [entry], controllerState: null });
    await writer.settled();
    await writeFile(join(root, "c1", "gym", "agent", "a1", ".records.jsonl.7.abcdef"), "partial");
    await writeFile(join(root, "c1", "gym", "agent", "a1", "notes.txt"), "?");
  });

  it("exits 0 with its ok line, and one warning line on stderr for each", async () => {
    expect(await verify("c1")).toBe(0);
    expect(stdout).toMatch(/^ok c1: 1 participants, 1 records, \d+ bytes\n$/);
    expect(stderr).toBe(
      "warning: gym/agent/a1/.records.jsonl.7.abcdef is named by no manifest (a crashed writer's temp file); a restore ignores it\n" +
        "warning: gym/agent/a1/notes.txt is named by no manifest (not a file gym-ckpt writes); a restore ignores it\n",
    );
  });

  it("--json lists them in the report (`unreferenced`), stderr left empty", async () => {
    expect(await verify("c1", "--json")).toBe(0);
    expect(JSON.parse(stdout)).toMatchObject({
      checkpoint_id: "c1",
      unreferenced: [
        { path: "gym/agent/a1/.records.jsonl.7.abcdef", kind: "temp" },
        { path: "gym/agent/a1/notes.txt", kind: "other" },
      ],
    });
    expect(stderr).toBe("");
  });

  it("--strict refuses them: no ok line, the warnings, then error invalid_checkpoint_state naming the count, exit 1", async () => {
    expect(await verify("c1", "--strict")).toBe(1);
    expect(stdout).toBe("");
    expect(stderr).toBe(
      "warning: gym/agent/a1/.records.jsonl.7.abcdef is named by no manifest (a crashed writer's temp file); a restore ignores it\n" +
        "warning: gym/agent/a1/notes.txt is named by no manifest (not a file gym-ckpt writes); a restore ignores it\n" +
        "error invalid_checkpoint_state: --strict: checkpoint c1 holds files or directories no manifest names (2, listed above)\n",
    );
  });

  it("--strict --json still prints the report (its `unreferenced` list), then the error on stderr, exit 1", async () => {
    expect(await verify("c1", "--strict", "--json")).toBe(1);
    expect(JSON.parse(stdout)).toMatchObject({ checkpoint_id: "c1", unreferenced: [{ kind: "temp" }, { kind: "other" }] });
    expect(stderr).toBe("error invalid_checkpoint_state: --strict: checkpoint c1 holds files or directories no manifest names (2, listed in unreferenced)\n");
  });
});

describe("gym-ckpt verify --strict of a checkpoint every file of which a manifest names", () => {
  it("exits 0 with its ok line, nothing on stderr", async () => {
    const entry = await writeParticipant(root, "c1", "agent", "a1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
    const writer = new GlobalManifestWriter(new CheckpointCatalog(root), 5);
    await writer.publish({ checkpointId: "c1", epoch: 1, preparedAt: 1, publishedAt: 2, stop: false, scope: null, restarts: [], participants: [entry], controllerState: null });
    await writer.settled();
    expect(await verify("c1", "--strict")).toBe(0);
    expect(stdout).toMatch(/^ok c1: 1 participants, 1 records, \d+ bytes\n$/);
    expect(stderr).toBe("");
  });
});
