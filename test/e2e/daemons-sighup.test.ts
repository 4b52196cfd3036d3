import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { membersBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { alive, descendants, killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";
import { MAIN, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * Closing the terminal a daemon runs in sends SIGHUP to its process group. Node's default action
 * killed each of them: the coordinator kept its lease key (a successor waited a whole lease_ms) and
 * logged no `coordinator_stopped`; the Gym's servers and attach proxy left their membership entries
 * until the TTL, and `gym-ckpt gym` exited 129. Each now stops as on SIGTERM (docs/operations.md).
 */
let nats: NatsFixture;
let root: string;
const seen = new TrackedProcesses();
let daemon: DaemonProcess | undefined;

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-sighup-"));
});
afterAll(async () => {
  await daemon?.kill().catch(() => undefined);
  killAll(seen);
  await nats?.close();
  if (root) await rm(root, { recursive: true, force: true });
});

const within = <T>(p: Promise<T>, ms: number) => Promise.race([p, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), ms).unref())]);

describe("SIGHUP (the terminal closed)", () => {
  it("stops the coordinator as SIGTERM does: its lease released, its stop line written, exit 0", { timeout: 60_000 }, async () => {
    const deployment = `hup${process.pid}`;
    // A lease long enough that a key left held keeps a successor from winning within the bound below.
    const args = [MAIN, "coordinator", "--deployment", deployment, "--nats-url", nats.server.url, "--token", "t0ken", "--checkpoint-root", root, "--lease-ms", "10000", "--no-http", "--log-level", "info"];
    daemon = spawnDaemon(args);
    const first = daemon;
    await waitUntil(() => first.stdout().includes('"msg":"lease_won"'), "the coordinator to win its lease", 20_000);
    daemon.child.kill("SIGHUP");
    expect(await within(daemon.exited, 15_000)).toEqual({ code: 0, signal: null });
    expect(daemon.stdout()).toMatch(/"reason":"SIGHUP","msg":"coordinator_stopped"/);
    // The key was released: its successor wins at once, not once the lease (10 s) ran out.
    const successor = spawnDaemon(args);
    try {
      await waitUntil(() => successor.stdout().includes('"msg":"lease_won"'), "the successor to win the lease", 5_000);
    } finally {
      await successor.kill("SIGTERM");
    }
  });

  it("stops `gym-ckpt gym` and every server it started, their membership entries deleted, exit 0", { timeout: 90_000 }, async () => {
    const deployment = `hupgym${process.pid}`;
    // Its own process group, as a terminal's session gives it: the hangup reaches every process in it.
    const gym: ChildProcess = spawn(process.execPath, [MAIN, "gym", "--nats", nats.server.url, "--deployment", deployment, "--token", "t0ken"], {
      stdio: ["ignore", "pipe", "pipe"],
      detached: true,
    });
    seen.add(gym.pid!);
    let stderr = "";
    gym.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => gym.once("exit", (code, signal) => resolve({ code, signal })));
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: gym.stdout! }).on("line", (line) => {
        if (line.includes('"name":"gym"') && line.includes('"ready":true')) resolve();
      });
      void exited.then((outcome) => reject(new Error(`gym exited early (${JSON.stringify(outcome)}): ${stderr}`)));
    });
    const started = descendants(gym.pid!);
    for (const p of started) seen.add(p.pid);
    const kv = await new Kvm(nats.nc).open(membersBucket(deployment));
    const members = async () => {
      const keys: string[] = [];
      for await (const key of await kv.keys()) keys.push(key);
      return keys;
    };
    expect((await members()).length).toBeGreaterThan(0);
    process.kill(-gym.pid!, "SIGHUP");
    expect(await within(exited, 30_000)).toEqual({ code: 0, signal: null });
    await waitUntil(() => started.every((p) => !alive(p.pid)), "every child of the gym to exit");
    expect(stderr).not.toMatch(/exited \(code/);
    // Each server stopped cleanly: its entry deleted, not left until the TTL.
    expect(await members()).toEqual([]);
  });
});
