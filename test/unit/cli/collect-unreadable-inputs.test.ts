import * as fsPromises from "node:fs/promises";
import { mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Command } from "commander";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { register } from "../../../coordinator/cli/commands/collect.js";

/**
 * `gym-ckpt collect` in process, its input files on storage that fails: an I/O error reading
 * `--tasks` or looking at `--out` is storage_error (exit 1), not a bad flag (exit 2).
 */
// stat of a path in `fault.paths` (mkdir of one in `fault.mkdirPaths`) fails with `fault.code` (tests run as root: permissions cannot).
const fault = vi.hoisted(() => ({ paths: [] as string[], mkdirPaths: [] as string[], code: "EIO" }));
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  const failure = (syscall: string, path: unknown) => Object.assign(new Error(`${fault.code}: failed, ${syscall} '${String(path)}'`), { code: fault.code, syscall, path });
  const stat = ((path: string, options?: Parameters<typeof actual.stat>[1]) =>
    fault.paths.includes(String(path)) ? Promise.reject(failure("stat", path)) : actual.stat(path, options)) as typeof actual.stat;
  const mkdir = ((path: string, options?: Parameters<typeof actual.mkdir>[1]) =>
    fault.mkdirPaths.includes(String(path)) ? Promise.reject(failure("mkdir", path)) : actual.mkdir(path, options)) as typeof actual.mkdir;
  return withOverrides(actual, { stat, mkdir });
});

let dir: string;
let stderr: string;
const signals = ["SIGUSR1", "SIGTERM", "SIGINT", "SIGHUP"] as const;
let before: Map<string, Function[]>;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collect-inputs-"));
  await writeFile(join(dir, "tasks.jsonl"), '{"id":"a","task":{}}\n');
  stderr = "";
  vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => ((stderr += String(chunk)), true));
  before = new Map(signals.map((s) => [s, process.listeners(s)]));
  process.exitCode = undefined;
});
afterEach(async () => {
  fault.paths = [];
  fault.mkdirPaths = [];
  vi.restoreAllMocks();
  for (const s of signals) for (const l of process.listeners(s)) if (!before.get(s)!.includes(l)) process.off(s, l as () => void);
  process.exitCode = undefined;
  await rm(dir, { recursive: true, force: true });
});

async function collect(tasks: string, out: string): Promise<number> {
  const program = new Command().exitOverride();
  register(program);
  await program.parseAsync(["collect", "--tasks", tasks, "--out", out, "--checkpoint-dir", join(dir, "ckpt"), "--run-url", "http://127.0.0.1:2/run", "--token", "t"], { from: "user" });
  return Number(process.exitCode ?? 0);
}

describe("gym-ckpt collect: input files the storage refuses", () => {
  it("a --tasks whose read fails with EIO is storage_error, exit 1, before anything is created", async () => {
    // Reading /proc/self/mem from offset 0 fails with EIO, as a failing disk's read would.
    expect(await collect("/proc/self/mem", join(dir, "results.jsonl"))).toBe(1);
    expect(stderr).toMatch(/^error storage_error: EIO: .*'\/proc\/self\/mem'\n$/);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it.each(["EIO", "EACCES", "ESTALE"])("an --out (or its directory) whose stat fails %s is storage_error, exit 1, before anything is created", async (code) => {
    fault.code = code;
    for (const failing of [join(dir, "results.jsonl"), dir]) {
      fault.paths = [failing];
      stderr = "";
      expect(await collect(join(dir, "tasks.jsonl"), join(dir, "results.jsonl"))).toBe(1);
      expect(stderr).toBe(`error storage_error: ${code}: failed, stat '${failing}'\n`);
    }
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it.each(["EIO", "EACCES", "ESTALE"])("a --checkpoint-dir whose stat or mkdir fails %s is storage_error, exit 1", async (code) => {
    fault.code = code;
    const ckpt = join(dir, "ckpt");
    fault.paths = [ckpt];
    expect(await collect(join(dir, "tasks.jsonl"), join(dir, "results.jsonl"))).toBe(1);
    expect(stderr).toBe(`error storage_error: ${code}: failed, stat '${ckpt}'\n`);
    fault.paths = [];
    fault.mkdirPaths = [ckpt];
    stderr = "";
    expect(await collect(join(dir, "tasks.jsonl"), join(dir, "results.jsonl"))).toBe(1);
    expect(stderr).toBe(`error storage_error: ${code}: failed, mkdir '${ckpt}'\n`);
    expect(await readdir(dir)).toEqual(["tasks.jsonl"]);
  });

  it("a --checkpoint-dir that is a file, or under one, stays invalid_request, exit 2", async () => {
    const file = join(dir, "tasks.jsonl");
    const ckptArgs = (ckpt: string) => ["collect", "--tasks", file, "--out", join(dir, "results.jsonl"), "--checkpoint-dir", ckpt, "--run-url", "http://127.0.0.1:2/run", "--token", "t"];
    for (const [ckpt, message] of [
      [file, "is not a directory"],
      [join(file, "ckpt"), "cannot be created (ENOTDIR)"],
    ] as const) {
      const program = new Command().exitOverride();
      register(program);
      stderr = "";
      process.exitCode = undefined;
      await program.parseAsync(ckptArgs(ckpt), { from: "user" });
      expect(process.exitCode).toBe(2);
      expect(stderr).toContain(`error invalid_request: --checkpoint-dir ${ckpt} ${message}`);
    }
  });

  it("a --tasks or --out that is not there, or not a file, stays invalid_request, exit 2", async () => {
    expect(await collect(join(dir, "missing.jsonl"), join(dir, "results.jsonl"))).toBe(2);
    expect(stderr).toContain("error invalid_request: tasks file");
    stderr = "";
    expect(await collect(join(dir, "tasks.jsonl"), join(dir, "no-such-dir", "results.jsonl"))).toBe(2);
    expect(stderr).toContain("error invalid_request: --out: directory");
    stderr = "";
    expect(await collect(join(dir, "tasks.jsonl"), dir)).toBe(2);
    expect(stderr).toContain("is not a regular file");
  });
});
