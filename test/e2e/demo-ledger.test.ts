import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, describe, expect, it } from "vitest";
import { alive, descendants, killAll } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";

/**
 * The demo's model attach proxy keeps its capture ledger in the shared default directory
 * `<tmp>/gym-ckpt-ledger-<uid>/demo/policy_model`, keyed only by the demo's fixed deployment name.
 * Every demo uses the same capture keys (demo-001…), so the ledger outlives the run (README: "removes its
 * work directory") and the next demo — or one running at the same time as this user — appends to the
 * previous run's lineage files: its first model call of demo-001 gets a parent_call_id from another run,
 * and its checkpoints export the other run's rows. The ledger belongs in the demo's work directory.
 */
const seen = new Set<number>();
const groups: number[] = [];
const scratches: string[] = [];
afterAll(async () => {
  killAll(seen);
  for (const group of groups) {
    try {
      process.kill(-group, "SIGKILL");
    } catch {
      // gone already
    }
  }
  for (const scratch of scratches) await rm(scratch, { recursive: true, force: true });
});

describe("gym-ckpt demo: the capture ledger", () => {
  it("leaves nothing under TMPDIR once the demo stopped (its ledger lived in its work directory)", { timeout: 60_000 }, async () => {
    const scratch = await mkdtemp(join(tmpdir(), "demo-ledger-"));
    scratches.push(scratch);
    const demo: ChildProcess = spawn(process.execPath, ["dist/coordinator/cli/main.js", "demo", "--rows", "16", "--token-delay-ms", "20"], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, TMPDIR: scratch },
      detached: true,
    });
    groups.push(demo.pid!);
    seen.add(demo.pid!);
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => demo.once("exit", (code, signal) => resolve({ code, signal })));
    // Wait until rows ran (model calls went through the attach proxy and into its ledger).
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: demo.stdout! }).on("line", (line) => {
        if (/collect: .* [1-9]\d*\/16 done/.test(line)) resolve();
      });
      void exited.then(({ code }) => reject(new Error(`demo exited early (${code})`)));
    });
    const started = descendants(demo.pid!);
    for (const p of started) seen.add(p.pid);
    demo.kill("SIGTERM");
    expect(await exited).toEqual({ code: 143, signal: null });
    await waitUntil(() => started.every((p) => !alive(p.pid)), "every process the demo started to exit");
    // Fails today: ["gym-ckpt-ledger-<uid>"] stays, holding demo/policy_model/demo-0NN.lineage.jsonl.
    expect(await readdir(scratch)).toEqual([]);
  });
});
