import { spawn } from "node:child_process";
import { afterAll, beforeAll, expect, it } from "vitest";
import { CONTROLLER_TOKEN, startWorld, type World } from "../integration/coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";
import { cli, daemonArgs, ensureBuilt, MAIN, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * A SIGTERM while an op runs that will not end soon (a prepare held by a blocker, its deadline a
 * minute away): the daemon waits stop_grace_ms for it, then stops as after a crash, lease released
 * and logged, instead of running to the op's deadline past the supervisor's SIGKILL (30 s).
 */

let world: World;
let daemon: DaemonProcess;
beforeAll(async () => {
  ensureBuilt();
  world = await startWorld();
  await world.startParticipants();
  world.participant("policy").adapter.addEpisode({ rollout_id: "c1", attempt: 0 }, { t: 1 });
  daemon = spawnDaemon(daemonArgs(world, ["--log-level", "info"]), { GYM_CKPT_STOP_GRACE_MS: "1000" });
});
afterAll(async () => {
  await daemon?.kill();
  await world?.close();
});

it("stops stop_grace_ms after SIGTERM with the op unanswered, the lease released, and the controller told the outcome is unknown", { timeout: 60_000 }, async () => {
  const env = { GYM_CKPT_NATS_URL: world.nats.server.url, GYM_CKPT_DEPLOYMENT: world.deployment, GYM_CKPT_CONTROLLER_TOKEN: CONTROLLER_TOKEN };
  world.participant("policy").adapter.setBlockers(["c1"]);
  const checkpoint = spawn(process.execPath, [MAIN, "checkpoint", "--id", "g-1", "--timeout-s", "60", "--episodes", "c1"], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  checkpoint.stdout.on("data", (d: Buffer) => (out += d.toString()));
  checkpoint.stderr.on("data", (d: Buffer) => (out += d.toString()));
  const answered = new Promise<number | null>((resolve) => checkpoint.once("exit", (code) => resolve(code)));
  await waitUntil(async () => {
    const status = await cli(["status", "--json"], env);
    return status.code === 0 && JSON.parse(status.stdout).checkpoint?.phase === "preparing";
  }, "checkpoint g-1 preparing");

  const termAt = performance.now();
  daemon.child.kill("SIGTERM");
  expect(await daemon.exited).toEqual({ code: 0, signal: null });
  // The grace (1 s) plus the lease release and the drain: nowhere near the op's minute.
  expect(performance.now() - termAt).toBeLessThan(15_000);
  expect(daemon.stdout() + daemon.stderr()).toMatch(/"msg":"coordinator_stop_ops_unanswered"/);
  expect(daemon.stdout() + daemon.stderr()).toMatch(/"msg":"coordinator_stopped"/);
  // No leader now, and none answered the op: its controller learns the outcome is unknown.
  expect(await answered).not.toBe(0);
  expect(out).toMatch(/outcome_unknown/);
});
