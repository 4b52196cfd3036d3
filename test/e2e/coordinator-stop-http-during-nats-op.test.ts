import { spawn } from "node:child_process";
import { afterAll, beforeAll, expect, it } from "vitest";
import { CONTROLLER_TOKEN, startWorld, type World } from "../integration/coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";
import { cli, daemonArgs, ensureBuilt, MAIN, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * A SIGTERM while an op that came over NATS is under way: the daemon answers that op, but serves
 * nothing new meanwhile, over HTTP either. Its stop waited for the NATS API's ops before it
 * stopped the HTTP API, which went on running every op sent to it until then (up to the NATS
 * op's deadline), on a coordinator about to release its lease.
 */

let world: World;
let daemon: DaemonProcess;
beforeAll(async () => {
  ensureBuilt();
  world = await startWorld();
  await world.startParticipants();
  world.participant("policy").adapter.addEpisode({ rollout_id: "c1", attempt: 0 }, { t: 1 });
  daemon = spawnDaemon(daemonArgs(world, ["--http-port", "0"]));
});
afterAll(async () => {
  await daemon?.kill();
  await world?.close();
});

it("the HTTP API serves nothing (not_leader) as soon as the stop starts, while the NATS op under way is still answered", { timeout: 60_000 }, async () => {
  const env = { GYM_CKPT_NATS_URL: world.nats.server.url, GYM_CKPT_DEPLOYMENT: world.deployment, GYM_CKPT_CONTROLLER_TOKEN: CONTROLLER_TOKEN };
  await waitUntil(() => /http (http:\/\/\S+)/.test(daemon.stdout()), "the daemon's HTTP address");
  const url = /http (http:\/\/\S+)/.exec(daemon.stdout())![1]!;
  // Held at prepare by a blocker until the test clears it (its deadline is a minute away).
  world.participant("policy").adapter.setBlockers(["c1"]);
  const checkpoint = spawn(process.execPath, [MAIN, "checkpoint", "--id", "s-1", "--timeout-s", "60", "--episodes", "c1"], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  let out = "";
  checkpoint.stdout.on("data", (d: Buffer) => (out += d.toString()));
  checkpoint.stderr.on("data", (d: Buffer) => (out += d.toString()));
  const answered = new Promise<number | null>((resolve) => checkpoint.once("exit", (code) => resolve(code)));
  let running = true;
  void answered.then(() => (running = false));
  await waitUntil(async () => {
    const status = await cli(["status", "--http-url", url, "--json"], env);
    return status.code === 0 && JSON.parse(status.stdout).checkpoint?.phase === "preparing";
  }, "checkpoint s-1 preparing");

  daemon.child.kill("SIGTERM");
  let refused: Awaited<ReturnType<typeof cli>> | undefined;
  await waitUntil(async () => {
    const status = await cli(["status", "--http-url", url, "--leader-wait-ms", "0"], env);
    if (status.code === 0) return false;
    refused = status;
    return true;
  }, "the stopping daemon's HTTP API to refuse a request");
  expect(running).toBe(true); // the NATS op is still under way
  // Its listener is closed (a new connection is refused) or, on a connection still open, the request is.
  expect(refused).toMatchObject({ code: 1, stderr: expect.stringMatching(/^error not_leader: (this coordinator is stopping|cannot reach the coordinator at .*ECONNREFUSED)/) });

  // The op under way is still answered, then the daemon stops.
  world.participant("policy").adapter.setBlockers([]);
  expect([await answered, out]).toEqual([0, expect.stringMatching(/^published s-1 /)]);
  expect(await daemon.exited).toEqual({ code: 0, signal: null });
});
