import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { alive, descendants, killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";

/**
 * `gym-ckpt attach model` and `gym-ckpt gym` run their participant program as a child. When the
 * `gym-ckpt` process is SIGKILLed (OOM killer, a supervisor's stop timeout), the child must stop
 * too: an orphaned attach proxy keeps serving and keeps its instance's membership claim, so the
 * restarted command exits `instance_conflict`.
 */
let nats: NatsFixture;
let dir: string;
const seen = new TrackedProcesses();
beforeAll(async () => {
  nats = await startNats();
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-parent-death-"));
});
afterAll(async () => {
  killAll(seen);
  await nats?.close();
  await rm(dir, { recursive: true, force: true });
});

/** Starts `script` (by default the CLI) and waits for the stdout line that `isReady` accepts. */
async function startCli(args: string[], isReady: (line: string) => boolean, script = "dist/coordinator/cli/main.js"): Promise<{ cli: ChildProcess; exited: Promise<unknown> }> {
  const cli = spawn(process.execPath, [script, ...args], { stdio: ["ignore", "pipe", "pipe"] });
  seen.add(cli.pid!);
  const exited = new Promise((resolve) => cli.once("exit", resolve));
  await new Promise<void>((resolve, reject) => {
    createInterface({ input: cli.stdout! }).on("line", (line) => isReady(line) && resolve());
    void exited.then(() => reject(new Error(`gym-ckpt ${args[0]} exited before it was ready`)));
  });
  return { cli, exited };
}

async function killAndExpectChildrenGone(cli: ChildProcess, exited: Promise<unknown>, programPath: string): Promise<void> {
  const started = descendants(cli.pid!);
  for (const p of started) seen.add(p.pid);
  expect(started.some((p) => p.cmdline.includes(programPath))).toBe(true);
  cli.kill("SIGKILL");
  await exited;
  await waitUntil(() => started.every((p) => !alive(p.pid)), `every process ${programPath} started to stop`, 20_000);
}

describe("participant programs stop with a SIGKILLed gym-ckpt", () => {
  it("gym-ckpt attach model: the proxy stops, and the command starts again for the same instance", { timeout: 60_000 }, async () => {
    const args = ["attach", "model", "--upstream", "http://127.0.0.1:9/v1", "--listen", "127.0.0.1:0", "--nats", nats.server.url, "--deployment", "orphan", "--instance", "policy_model", "--token", "orphan-token", "--ledger-dir", dir, "--cuts", "off"];
    const ready = (line: string) => line.includes('"ready":true');
    const first = await startCli(args, ready);
    await killAndExpectChildrenGone(first.cli, first.exited, "participants/attach/main.js");
    const again = await startCli(args, ready);
    again.cli.kill("SIGTERM");
    await again.exited;
  });

  it("gym-ckpt gym: the launcher stops its servers", { timeout: 60_000 }, async () => {
    const { cli, exited } = await startCli(["gym", "--nats", nats.server.url, "--deployment", "orphan-gym", "--token", "t0ken"], (line) => line.includes('"name":"gym"') && line.includes('"ready":true'));
    await killAndExpectChildrenGone(cli, exited, "participants/gym/main.js");
  });

  it("the Gym launcher itself SIGKILLed: its servers stop (none keeps its port or its participant's name)", { timeout: 60_000 }, async () => {
    const launcher = "dist/participants/gym/main.js";
    const isReady = (line: string) => line.includes('"name":"gym"') && line.includes('"ready":true');
    const args = ["--nats", nats.server.url, "--deployment", "orphan-launcher", "--token", "t0ken"];
    const { cli, exited } = await startCli(args, isReady, launcher);
    await killAndExpectChildrenGone(cli, exited, "participants/gym/environment-server/main.js");
    // Every server's name is free again: a new launcher for the same deployment starts.
    const again = await startCli(args, isReady, launcher);
    for (const p of descendants(again.cli.pid!)) seen.add(p.pid);
    again.cli.kill("SIGTERM");
    await again.exited;
  });
});
