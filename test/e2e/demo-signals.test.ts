import { spawn, spawnSync, type ChildProcess } from "node:child_process";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, describe, expect, it } from "vitest";
import { ProcessGroup } from "../../coordinator/local/process-group.js";
import { alive, descendants, killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";

/** `gym-ckpt demo` stopped by a signal mid-run: no process and no temp directory is left behind. */
const seen = new TrackedProcesses();
/** Each demo runs in its own process group: teardown reaches whatever it started, even before the test saw it. */
const groups: ProcessGroup[] = [];
const scratches: string[] = [];
afterAll(async () => {
  killAll(seen);
  for (const group of groups) group.signal("SIGKILL");
  for (const scratch of scratches) await rm(scratch, { recursive: true, force: true });
});

/** A demo whose reference Gym is up, with every process it started so far. */
async function runningDemo() {
  const { demo, exited, scratch } = await demoUntil(/reference Gym up/);
  const started = descendants(demo.pid!);
  for (const p of started) seen.add(p.pid);
  // nats-server, coordinator, policy backend, the gym launcher and its four servers.
  expect(started.length).toBeGreaterThanOrEqual(8);
  // The attach proxy's capture ledger lives in the demo's work directory (the Gym's TMPDIR), not the
  // shared <tmp>/gym-ckpt-ledger-<uid>/ a later demo (same deployment, same capture keys) would append to.
  const ours = async () => (await readdir(scratch)).filter((name) => name.startsWith("gym-ckpt-demo-") || name.startsWith("gym-ckpt-nats-"));
  expect(await ours()).toHaveLength(2);
  return { demo, exited, started, ours, scratch };
}

/** A demo started in its own process group (as from a terminal), up to the stdout line `until` matches. */
async function demoUntil(until: RegExp) {
  const scratch = await mkdtemp(join(tmpdir(), "demo-signals-"));
  scratches.push(scratch);
  const demo: ChildProcess = spawn(process.execPath, ["dist/coordinator/cli/main.js", "demo", "--rows", "40", "--token-delay-ms", "60"], {
    stdio: ["ignore", "pipe", "pipe"],
    env: { ...process.env, TMPDIR: scratch },
    detached: true,
  });
  groups.push(new ProcessGroup(demo.pid!));
  seen.add(demo.pid!);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => demo.once("exit", (code, signal) => resolve({ code, signal })));
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: demo.stdout! }).on("line", (line) => {
      if (until.test(line)) resolve();
    });
    void exited.then(({ code }) => reject(new Error(`demo exited early (${code})`)));
  });
  return { demo, exited, scratch };
}

describe("gym-ckpt demo", () => {
  it("a Ctrl-C while the Gym starts ends that start at once: exit 130 without waiting for the Gym's ready line", { timeout: 60_000 }, async () => {
    // The backend is up: the Gym launcher (its own process group, which the terminal's Ctrl-C does
    // not reach) is starting. The Ctrl-C stops nats-server too, so that start can only fail, after
    // its servers' NATS connect timeout (10 s); the clean-up used to wait for it.
    const { demo, exited, scratch } = await demoUntil(/fake policy backend/);
    // Everything the demo started by then, the starting Gym included (it is not a member of this
    // group): read before the signal, so "every process exited" below is about something.
    const started = descendants(demo.pid!);
    expect(started.length).toBeGreaterThan(0);
    for (const p of started) seen.add(p.pid);
    const sent = Date.now();
    process.kill(-demo.pid!, "SIGINT");
    const { code, signal } = await exited;
    const tookMs = Date.now() - sent;
    await waitUntil(() => started.every((p) => !alive(p.pid)), "every process the demo started to exit");
    expect({ code, signal }).toEqual({ code: 130, signal: null });
    expect(await readdir(scratch)).toEqual([]);
    // It took ~10 s before (the clean-up waited for the Gym's servers to give up connecting to the stopped nats-server).
    expect(tookMs).toBeLessThan(5_000);
  });


  it("a collector killed by a signal (the OOM killer) fails the demo at once: exit 1, every process stopped, its directories removed", { timeout: 60_000 }, async () => {
    const { demo, exited, scratch } = await demoUntil(/collecting \d+ multi-turn rows/);
    let collector: { pid: number; cmdline: string } | undefined;
    await waitUntil(() => (collector = descendants(demo.pid!).find((p) => / collect /.test(p.cmdline))) !== undefined, "the collector to start");
    const started = descendants(demo.pid!);
    for (const p of started) seen.add(p.pid);
    process.kill(collector!.pid, "SIGKILL");
    // Before, the demo only looked at exit codes, so a death by signal went unseen and it waited
    // out "rows to finish before the crash" (120 s).
    const { code, signal } = await exited;
    await waitUntil(() => started.every((p) => !alive(p.pid)), "every process the demo started to exit");
    expect({ code, signal }).toEqual({ code: 1, signal: null });
    expect(await readdir(scratch)).toEqual([]);
  });

  it("kills every process it started and removes its directories on SIGTERM", async () => {
    const { demo, exited, started, ours, scratch } = await runningDemo();
    demo.kill("SIGTERM");
    const { code, signal } = await exited;
    await waitUntil(() => started.every((p) => !alive(p.pid)), "every process the demo started to exit");
    expect(await ours()).toEqual([]);
    expect(await readdir(scratch)).toEqual([]); // nothing else either: no capture ledger left behind
    expect({ code, signal }).toEqual({ code: 143, signal: null });
  });

  it("a second Ctrl-C while it stops changes nothing: it still removes everything and exits 130", async () => {
    const { demo, exited, started, ours } = await runningDemo();
    let gone = false;
    void exited.then(() => (gone = true));
    // Repeats from the moment the demo says it is stopping until it exits: each lands during its clean-up.
    const repeats = new Promise<void>((resolve) => {
      createInterface({ input: demo.stdout! }).on("line", (line) => {
        if (!line.includes("SIGINT: stopping")) return;
        const again = () => {
          if (gone) return resolve();
          demo.kill("SIGINT");
          setTimeout(again, 10);
        };
        again();
      });
    });
    process.kill(-demo.pid!, "SIGINT"); // the terminal's Ctrl-C, to the demo's process group
    const { code, signal } = await exited;
    await repeats;
    await waitUntil(() => started.every((p) => !alive(p.pid)), "every process the demo started to exit", 30_000);
    expect({ code, signal }).toEqual({ code: 130, signal: null });
    expect(await ours()).toEqual([]);
  });

  it("does the same when its terminal hangs up (SIGHUP to its process group): the detached Gym and nats-server go too", async () => {
    const { demo, exited, started, ours } = await runningDemo();
    process.kill(-demo.pid!, "SIGHUP");
    const { code, signal } = await exited;
    await waitUntil(() => started.every((p) => !alive(p.pid)), "every process the demo started to exit");
    expect(await ours()).toEqual([]);
    expect({ code, signal }).toEqual({ code: 129, signal: null });
  });

  it("SIGKILLed, it cleans up nothing, but every program it started stops by itself once the demo is gone", { timeout: 60_000 }, async () => {
    const { demo, exited, started, ours } = await runningDemo();
    demo.kill("SIGKILL");
    expect(await exited).toEqual({ code: null, signal: "SIGKILL" });
    // nats-server cannot watch its parent: it is SIGKILLed with it through setpriv --pdeathsig, when there.
    const setpriv = spawnSync("setpriv", ["--help"], { encoding: "utf8" }).stdout?.includes("--pdeathsig") === true;
    const expectedGone = started.filter((p) => setpriv || !p.cmdline.includes("nats-server"));
    // The programs' own clean-up runs first (the Gym launcher stops its servers); one that hangs is cut short after 10 s.
    await waitUntil(() => expectedGone.every((p) => !alive(p.pid)), "every process the demo started to exit", 30_000);
    // What a SIGKILL leaves: the work and NATS store directories (docs/collect.md).
    expect(await ours()).toHaveLength(2);
  });
});
