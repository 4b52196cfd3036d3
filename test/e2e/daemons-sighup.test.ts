import { spawn, type ChildProcess } from "node:child_process";
import { existsSync } from "node:fs";
import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { Kvm } from "@nats-io/kv";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { membersBucket } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { alive, descendants, killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";
import { ensureBuilt, spawnDaemon } from "./coordinator-process.js";

/**
 * Closing the terminal a daemon runs in hangs it up. Node's default action for SIGHUP killed each
 * of them: the coordinator kept its lease key (a successor waited a whole lease_ms) and logged no
 * `coordinator_stopped`; the Gym's servers and attach proxy left their membership entries until the
 * TTL. Each now stops as on SIGTERM, then dies by SIGHUP as `collect` does (an ordinary exit on a
 * gone terminal aborts in Node 20: SIGABRT, nodejs/node#51519).
 *
 * The programs run on a pseudo-terminal made by util-linux `script`, under a small session leader
 * that passes the hangup on to its job's process group as a login shell does (bash's SIGHUP to
 * each job reaches every process the job started: the Gym's servers share its group) and writes
 * down how the job ended (as in collect-terminal-hangup.test.ts). Killing `script` closes the terminal.
 */
const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));
const SESSION_LEADER = `
const { spawn } = require("node:child_process");
const { writeFileSync } = require("node:fs");
const [status, ...args] = process.argv.slice(2);
const child = spawn(process.execPath, args, { stdio: "inherit", detached: true });
process.on("SIGHUP", () => process.kill(-child.pid, "SIGHUP"));
child.on("exit", (code, signal) => writeFileSync(status, JSON.stringify({ code, signal })));
`;
const quote = (arg: string) => `'${arg.replaceAll("'", "'\\''")}'`;

let nats: NatsFixture;
let dir: string;
const seen = new TrackedProcesses();
const terminals: ChildProcess[] = [];

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-sighup-"));
  await writeFile(join(dir, "session-leader.cjs"), SESSION_LEADER);
});
afterAll(async () => {
  for (const t of terminals) t.kill("SIGKILL");
  killAll(seen);
  await nats?.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

/** Runs `gym-ckpt <args>` on a terminal; `hangUp()` closes it and returns how the program ended. */
function onTerminal(name: string, args: string[]) {
  const status = join(dir, `${name}-status.json`);
  const command = `exec ${[process.execPath, join(dir, "session-leader.cjs"), status, CLI, ...args].map(quote).join(" ")}`;
  const terminal = spawn("script", ["-qfec", command, "/dev/null"], { stdio: ["pipe", "pipe", "pipe"] });
  terminals.push(terminal);
  let screen = "";
  terminal.stdout!.on("data", (chunk: Buffer) => (screen += chunk.toString()));
  return {
    screen: () => screen,
    pid: terminal.pid!,
    async hangUp(): Promise<unknown> {
      terminal.kill("SIGKILL");
      await waitUntil(() => existsSync(status), `${name} to end`, 30_000);
      return JSON.parse(await readFile(status, "utf8")) as unknown;
    },
  };
}

describe("a terminal hangup (SIGHUP)", () => {
  it("stops the coordinator as SIGTERM does: its lease released for a successor at once, then it dies by SIGHUP", { timeout: 60_000 }, async () => {
    const deployment = `hup${process.pid}`;
    // A lease long enough that a key left held keeps the successor from winning within the bound below.
    const args = ["coordinator", "--deployment", deployment, "--nats-url", nats.server.url, "--token", "t0ken", "--checkpoint-root", join(dir, "root"), "--lease-ms", "10000", "--no-http", "--log-level", "info"];
    const daemon = onTerminal("coordinator", args);
    await waitUntil(() => daemon.screen().includes('"msg":"lease_won"'), "the coordinator to win its lease", 20_000);
    // Before: killed by the hangup with its key held. Dying by SIGHUP after an ordinary exit was tried: SIGABRT.
    expect(await daemon.hangUp(), daemon.screen()).toEqual({ code: null, signal: "SIGHUP" });
    const successor = spawnDaemon([CLI, ...args]);
    try {
      await waitUntil(() => successor.stdout().includes('"msg":"lease_won"'), "the successor to win the lease", 5_000);
    } finally {
      await successor.kill("SIGTERM");
    }
  });

  it("stops `gym-ckpt gym` and every server it started, their membership entries deleted", { timeout: 90_000 }, async () => {
    const deployment = `hupgym${process.pid}`;
    const gym = onTerminal("gym", ["gym", "--nats", nats.server.url, "--deployment", deployment, "--token", "t0ken"]);
    await waitUntil(() => /"name":"gym"[^\n]*"ready":true|"ready":true[^\n]*"name":"gym"/.test(gym.screen()), "the gym to be ready", 60_000);
    const started = descendants(gym.pid);
    for (const p of started) seen.add(p.pid);
    const kv = await new Kvm(nats.nc).open(membersBucket(deployment));
    const members = async () => {
      const keys: string[] = [];
      for await (const key of await kv.keys()) keys.push(key);
      return keys.sort();
    };
    expect((await members()).length).toBeGreaterThan(0);
    expect(await gym.hangUp(), gym.screen()).toEqual({ code: null, signal: "SIGHUP" });
    await waitUntil(() => started.every((p) => !alive(p.pid)), "every child of the gym to exit");
    // Each server stopped cleanly: its entry deleted, not left until the TTL.
    expect(await members()).toEqual([]);
  });
});
