import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, describe, expect, it } from "vitest";
import { alive, descendants, killAll } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";

/** `gym-ckpt demo` stopped by a signal mid-run: no process and no temp directory is left behind. */
const seen = new Set<number>();
/** The demo runs in its own process group: teardown reaches whatever it started, even before the test saw it. */
let group: number | undefined;
let scratch: string | undefined;
afterAll(async () => {
  killAll(seen);
  if (group !== undefined) {
    try {
      process.kill(-group, "SIGKILL");
    } catch {
      // the group is gone already
    }
  }
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

describe("gym-ckpt demo", () => {
  it("kills every process it started and removes its directories on SIGTERM", async () => {
    // The demo's work and NATS store directories go under TMPDIR: a private one shows what is left.
    scratch = await mkdtemp(join(tmpdir(), "demo-signals-"));
    const demo: ChildProcess = spawn(process.execPath, ["dist/coordinator/cli/main.js", "demo", "--rows", "40", "--token-delay-ms", "60"], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, TMPDIR: scratch },
      detached: true,
    });
    group = demo.pid;
    seen.add(demo.pid!);
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => demo.once("exit", (code, signal) => resolve({ code, signal })));
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: demo.stdout! }).on("line", (line) => {
        if (line.includes("reference Gym up")) resolve();
      });
      void exited.then(({ code }) => reject(new Error(`demo exited early (${code})`)));
    });
    const started = descendants(demo.pid!);
    for (const p of started) seen.add(p.pid);
    // nats-server, coordinator, policy backend, the gym launcher and its four servers.
    expect(started.length).toBeGreaterThanOrEqual(8);
    // The attach proxy's shared ledger directory (gym-ckpt-ledger) is not the demo's to remove.
    const ours = async () => (await readdir(scratch!)).filter((name) => name.startsWith("gym-ckpt-demo-") || name.startsWith("gym-ckpt-nats-"));
    expect(await ours()).toHaveLength(2);
    demo.kill("SIGTERM");
    const { code, signal } = await exited;
    await waitUntil(() => started.every((p) => !alive(p.pid)), "every process the demo started to exit");
    expect(await ours()).toEqual([]);
    expect({ code, signal }).toEqual({ code: 143, signal: null });
  });
});
