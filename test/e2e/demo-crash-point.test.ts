import { spawn } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ProcessGroup } from "../../coordinator/local/process-group.js";
import { descendants } from "../support/process-tree.js";

/** The demo's crash point (docs/collect.md, "The demo") at the edges its flags allow. */
const groups: ProcessGroup[] = [];
const scratches: string[] = [];
afterAll(async () => {
  for (const group of groups) group.signal("SIGKILL");
  for (const scratch of scratches) await rm(scratch, { recursive: true, force: true });
});

/** Runs the built demo in a process group of its own, in a scratch TMPDIR; `onOutput` is called with its pid at each chunk of its stdout. */
async function runBuiltDemo(args: string[], onOutput?: (pid: number) => void): Promise<{ output: string; code: number | null }> {
  const scratch = await mkdtemp(join(tmpdir(), "demo-crash-point-"));
  scratches.push(scratch);
  const demo = spawn(process.execPath, ["dist/coordinator/cli/main.js", "demo", ...args], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, TMPDIR: scratch },
    detached: true,
  });
  groups.push(new ProcessGroup(demo.pid!));
  let output = "";
  demo.stdout!.on("data", (chunk: Buffer) => {
    output += chunk.toString();
    onOutput?.(demo.pid!);
  });
  demo.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()));
  const code = await new Promise<number | null>((resolve) => demo.once("exit", resolve));
  return { output, code };
}

/**
 * `gym-ckpt demo --checkpoint-every S` with S longer than the run: no timer checkpoint is published
 * before the crash point, and the demo's own SIGUSR1 checkpoint is the one it crashes after. It used
 * to wait for a timer checkpoint first, so the collection finished every row and the demo failed.
 *
 * Its processes are also looked at while it runs: the token must not be on any command line, where
 * any local user can read it (docs/operations.md).
 */
describe("gym-ckpt demo --checkpoint-every", () => {
  it("crashes and continues when no timer checkpoint comes before the crash point", async () => {
    // Each line the demo prints is a moment to look at its processes' command lines.
    const commandLines = new Set<string>();
    const { output, code } = await runBuiltDemo(["--rows", "30", "--checkpoint-every", "600"], (pid) => {
      for (const { cmdline } of descendants(pid)) commandLines.add(cmdline);
    });
    expect(output).toMatch(/now SIGKILL the collector/);
    expect(output).toMatch(/demo passed/);
    expect(code).toBe(0);
    const seen = [...commandLines];
    // Seen: the daemon, the collector and the Gym's servers (so the check below looked at them).
    expect(seen.some((line) => / coordinator /.test(line))).toBe(true);
    expect(seen.some((line) => / collect /.test(line))).toBe(true);
    expect(seen.some((line) => /environment-server|gym\/environment/.test(line))).toBe(true);
    expect(seen.filter((line) => /--token(\s|=|$)/.test(line))).toEqual([]);
  }, 240_000);
});

/**
 * `gym-ckpt demo --crash-after S` with S close to 1, every row in flight at once: the rows run in
 * step and the last ones finish within the demo's poll of results.jsonl, before its hold of the
 * backend's responses lands (that hold keeps only responses not started yet). The collector then
 * finished every row, took no SIGUSR1 checkpoint (none once every row has finished) and exited 0,
 * and the demo failed with "the collector exited (code 0) while waiting for the last checkpoint
 * before the crash", although the CLI accepts every share that leaves a row unfinished at the crash
 * point. The run's last model call is now held from the start until the crash.
 */
describe("gym-ckpt demo --crash-after", () => {
  it("crashes with a row unfinished when the rows left at the crash point all finish together", async () => {
    const { output, code } = await runBuiltDemo(["--rows", "20", "--concurrency", "20", "--crash-after", "0.9", "--token-delay-ms", "0"]);
    expect(output).not.toMatch(/while waiting for the last checkpoint before the crash/);
    expect(output).toMatch(/now SIGKILL the collector/);
    // The row the crash left unfinished continued from the checkpoint.
    expect(output).toMatch(/rows continued from checkpoint ckpt-\S+: [1-9]/);
    expect(output).toMatch(/demo passed/);
    expect(code).toBe(0);
  }, 240_000);
});
