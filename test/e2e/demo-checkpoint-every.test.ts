import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { ProcessGroup } from "../../coordinator/local/process-group.js";

/**
 * `gym-ckpt demo --checkpoint-every S` with S longer than the run: no timer checkpoint is published
 * before the crash point, and the demo's own SIGUSR1 checkpoint is the one it crashes after
 * (docs/collect.md, "The demo"). It used to wait for a timer checkpoint first, so the collection
 * finished every row and the demo failed.
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
    demo.stdout!.on("data", (chunk: Buffer) => (output += chunk.toString()));
    demo.stderr!.on("data", (chunk: Buffer) => (output += chunk.toString()));
    const { code } = await new Promise<{ code: number | null }>((resolve) => demo.once("exit", (code) => resolve({ code })));
    expect(output).toMatch(/now SIGKILL the collector/);
    expect(output).toMatch(/demo passed/);
    expect(code).toBe(0);
  }, 240_000);
});
