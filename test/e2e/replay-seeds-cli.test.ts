import { execFile, execFileSync } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { afterEach, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { MANIFEST_SCHEMA_VERSION } from "../../protocol/index.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * The seeds exporter's refusals (built binary): each names its catalog code on stderr, and the exit
 * code follows gym-ckpt's: 2 for usage errors and invalid_request (a mistyped --out directory too,
 * as for collect), 1 for any other refusal.
 */
const REPLAY_MAIN = fileURLToPath(new URL("../../dist/participants/replay/main.js", import.meta.url));
const run = promisify(execFile);

beforeAll(() => ensureBuilt());
let dir: string;
/** Where --out goes by default: beside the checkpoint, never inside it (refused). */
let outDir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "replay-seeds-cli-"));
  outDir = await mkdtemp(join(tmpdir(), "replay-seeds-out-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
  await rm(outDir, { recursive: true, force: true });
});

async function seeds(args: string[]): Promise<{ code: number; stderr: string }> {
  try {
    const { stderr } = await run(process.execPath, [REPLAY_MAIN, "seeds", "--out", join(outDir, "out.jsonl"), ...args], { timeout: 30_000 });
    return { code: 0, stderr };
  } catch (error) {
    const e = error as { code?: number; stderr?: string };
    return { code: typeof e.code === "number" ? e.code : -1, stderr: e.stderr ?? "" };
  }
}

describe("replay seeds (built binary)", () => {
  it("prints its usage on stdout, exit 0, for --help before or after the command; no command is a usage error, exit 2", async () => {
    for (const args of [["--help"], ["-h"], ["seeds", "--help"]]) {
      const { stdout, stderr } = await run(process.execPath, [REPLAY_MAIN, ...args], { timeout: 30_000 });
      expect({ args, stdout, stderr }).toEqual({ args, stdout: expect.stringMatching(/^usage: gym-ckpt seeds /), stderr: "" });
    }
    await expect(run(process.execPath, [REPLAY_MAIN], { timeout: 30_000 })).rejects.toMatchObject({ code: 2, stderr: expect.stringMatching(/^usage: /) });
  });

  it("refuses a missing or malformed --tasks file and a directory that is no checkpoint with invalid_request, exit 2", async () => {
    const missing = await seeds(["--checkpoint", dir, "--tasks", join(dir, "absent.jsonl")]);
    expect(missing).toEqual({ code: 2, stderr: expect.stringMatching(/^replay: invalid_request: tasks file .*absent\.jsonl does not exist\n$/) });
    await writeFile(join(dir, "tasks.jsonl"), "not json\n");
    const malformed = await seeds(["--checkpoint", dir, "--tasks", join(dir, "tasks.jsonl")]);
    expect(malformed).toEqual({ code: 2, stderr: expect.stringMatching(/^replay: invalid_request: .*tasks\.jsonl:1: not JSON\n$/) });
    const notCheckpoint = await seeds(["--checkpoint", dir]);
    expect(notCheckpoint).toEqual({ code: 2, stderr: expect.stringMatching(/^replay: invalid_request: .*not a published checkpoint/) });
  });

  it("refuses an --out that is the --tasks file or inside the checkpoint with invalid_request, exit 2, leaving both as they were", async () => {
    await writeFile(join(outDir, "tasks.jsonl"), "{}\n");
    const tasks = await seeds(["--checkpoint", dir, "--tasks", join(outDir, "tasks.jsonl"), "--out", join(outDir, "tasks.jsonl")]);
    expect(tasks).toEqual({ code: 2, stderr: `replay: invalid_request: --out ${join(outDir, "tasks.jsonl")} is the --tasks file\n` });
    expect(await readFile(join(outDir, "tasks.jsonl"), "utf8")).toBe("{}\n");
    await writeFile(join(dir, "checkpoint.json"), "{}");
    const inside = await seeds(["--checkpoint", dir, "--out", join(dir, "checkpoint.json")]);
    expect(inside).toEqual({ code: 2, stderr: `replay: invalid_request: --out ${join(dir, "checkpoint.json")} is inside the checkpoint ${dir}, which the export reads\n` });
    expect(await readFile(join(dir, "checkpoint.json"), "utf8")).toBe("{}");
  });

  it("refuses an --out in a directory that does not exist with invalid_request, exit 2, and creates no directory", async () => {
    const out = join(dir, "nonexist", "s.jsonl");
    const refused = await seeds(["--checkpoint", dir, "--out", out]);
    expect(refused).toEqual({ code: 2, stderr: `replay: invalid_request: --out: directory ${join(dir, "nonexist")} does not exist\n` });
    expect(existsSync(join(dir, "nonexist"))).toBe(false);
  });

  it("an --out the storage refuses to create (a directory under /proc, for root too) is storage_error naming the file, exit 1", async () => {
    // A published checkpoint with nothing parked: zero seeds, then the --out write.
    const manifest = { schema_version: MANIFEST_SCHEMA_VERSION, checkpoint_id: "cp-1", epoch: 1, prepared_at: 1, published_at: 2, stop: false, scope: null, restarts: [], participants: [], controller_state: null };
    await writeFile(join(dir, "checkpoint.json"), JSON.stringify(manifest));
    const refused = await seeds(["--checkpoint", dir, "--out", "/proc/self/seeds.jsonl"]);
    expect(refused).toEqual({ code: 1, stderr: expect.stringMatching(/^replay: storage_error: ENOENT: no such file or directory, open '\/proc\/self\/\.seeds\.jsonl\.[^']+\.tmp'\n$/) });
  });

  it("refuses a checkpoint.json that is a FIFO with invalid_checkpoint_state, exit 1, without blocking", async () => {
    execFileSync("mkfifo", [join(dir, "checkpoint.json")]);
    const fifo = await seeds(["--checkpoint", dir]);
    expect(fifo).toEqual({ code: 1, stderr: expect.stringMatching(/^replay: invalid_checkpoint_state: .*not a regular file/) });
  });
});
