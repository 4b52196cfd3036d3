import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ProcessGroup } from "../../coordinator/local/process-group.js";
import { descendants } from "../support/process-tree.js";

/**
 * `gym-ckpt demo --checkpoint-every S` with S longer than the run: no timer checkpoint is published
 * before the crash point, and the demo's own SIGUSR1 checkpoint is the one it crashes after
 * (docs/collect.md, "The demo"). It used to wait for a timer checkpoint first, so the collection
 * finished every row and the demo failed.
 *
 * Its processes are also looked at while it runs: the token must not be on any command line, where
 * any local user can read it (docs/operations.md).
 */
const groups: ProcessGroup[] = [];
const scratches: string[] = [];
afterAll(async () => {
  for (const group of groups) group.signal("SIGKILL");
  for (const scratch of scratches) await rm(scratch, { recursive: true, force: true });
});

describe("gym-ckpt demo --checkpoint-every", () => {
  it("crashes and continues when no timer checkpoint comes before the crash point", async () => {
    const scratch = await mkdtemp(join(tmpdir(), "demo-checkpoint-every-"));
    scratches.push(scratch);
    const demo: ChildProcess = spawn(process.execPath, ["dist/coordinator/cli/main.js", "demo", "--rows", "30", "--checkpoint-every", "600"], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, TMPDIR: scratch },
      detached: true,
    });
    groups.push(new ProcessGroup(demo.pid!));
    let output = "";
    // Each line the demo prints is a moment to look at its processes' command lines.
    const commandLines = new Set<string>();
    demo.stdout!.on("data", (chunk: Buffer) => {
      output += chunk.toString();
      for (const { cmdline } of descendants(demo.pid!)) commandLines.add(cmdline);
    });
    demo.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()));
    const { code } = await new Promise<{ code: number | null }>((resolve) => demo.once("exit", (code) => resolve({ code })));
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
