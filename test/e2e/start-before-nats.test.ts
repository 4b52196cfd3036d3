import { spawn, type ChildProcess } from "node:child_process";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";
import { NatsServerProcess } from "../support/nats.js";
import { freePortRun } from "../support/ports.js";
import { killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";
import { cli, ensureBuilt, MAIN, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * A node's processes coming back together: the coordinator daemon and a participant program started
 * while their NATS server is still down wait for it (GYM_CKPT_NATS_CONNECT_WAIT_MS /
 * --nats-connect-wait-ms) instead of exiting 1 for a supervisor that may not exist.
 */
const seen = new TrackedProcesses();
let server: NatsServerProcess | undefined;
let daemon: DaemonProcess | undefined;
let dir: string | undefined;
afterAll(async () => {
  killAll(seen);
  await daemon?.kill();
  await server?.dispose();
  if (dir) await rm(dir, { recursive: true, force: true });
});

const WAITING = "NATS is not reachable yet";

describe("started before its NATS server", () => {
  it("the coordinator daemon and a participant program say once that they wait, then serve once NATS starts", async () => {
    ensureBuilt();
    dir = await mkdtemp(join(tmpdir(), "gym-ckpt-start-before-nats-"));
    const port = await freePortRun(1);
    const url = `nats://127.0.0.1:${port}`;
    const deployment = `early${process.pid}`;
    daemon = spawnDaemon([MAIN, "coordinator", "--deployment", deployment, "--nats-url", url, "--token", "t0ken", "--checkpoint-root", dir, "--no-http", "--lease-ms", "500", "--log-level", "warn"], {
      GYM_CKPT_NATS_CONNECT_WAIT_MS: "30000",
    });
    seen.add(daemon.child.pid!);
    const participant: ChildProcess = spawn(
      process.execPath,
      ["dist/participants/attach/main.js", "--token", "t0ken", "--upstream", "http://127.0.0.1:9/v1", "--nats", url, "--deployment", deployment, "--instance", "early", "--nats-connect-wait-ms", "30000"],
      { stdio: ["ignore", "pipe", "pipe"] },
    );
    seen.add(participant.pid!);
    let participantOut = "";
    participant.stdout!.on("data", (chunk) => (participantOut += String(chunk)));
    participant.stderr!.on("data", (chunk) => (participantOut += String(chunk)));

    await waitUntil(() => daemon!.stdout().includes(WAITING) && participantOut.includes(WAITING), "both processes to say they wait for NATS", 20_000);
    expect([daemon.child.exitCode, participant.exitCode]).toEqual([null, null]);
    server = await NatsServerProcess.start({ port });

    await waitUntil(() => participantOut.includes('"ready":true'), "the participant's ready line", 20_000);
    // The daemon became the leader and sees the participant: the controller API answers.
    const status = await cli(["status", "--json", "--nats-url", url, "--deployment", deployment, "--token", "t0ken", "--leader-wait-ms", "20000"]);
    expect([status.code, status.stderr]).toEqual([0, ""]);
    expect(JSON.parse(status.stdout)).toMatchObject({ participants: [expect.objectContaining({ kind: "model", instance: "early" })] });
    // One warning each, not one per try.
    const warnings = (out: string) => out.split("\n").filter((line) => line.includes(WAITING)).length;
    expect([warnings(daemon.stdout()), warnings(participantOut)]).toEqual([1, 1]);
  }, 60_000);
});
