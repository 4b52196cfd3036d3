import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { MAIN, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/** A supervisor's SIGTERM must stop the daemon even when NATS went away first (a host shutting down). */
const TOKEN = "stop-token";
let nats: NatsFixture | undefined;
let root: string;
let daemon: DaemonProcess | undefined;
const deployment = `stopnonats${process.pid}`;

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-stop-"));
});

afterAll(async () => {
  await daemon?.kill().catch(() => undefined);
  await nats?.close().catch(() => undefined);
  if (root) await rm(root, { recursive: true, force: true });
});

describe("coordinator shutdown", () => {
  it("exits promptly on SIGTERM after its NATS server died (the connection is closed, not left reconnecting)", async () => {
    daemon = spawnDaemon([MAIN, "coordinator", "--deployment", deployment, "--nats-url", nats!.server.url, "--token", TOKEN, "--checkpoint-root", root, "--lease-ms", "300", "--no-http", "--log-level", "warn"]);
    const client = new NatsControllerClient({ nc: nats!.nc, deployment, token: TOKEN, leaderWaitMs: 15_000 });
    expect((await client.status()).coordinator.leader).toBe(true);
    await nats!.close();
    nats = undefined;
    daemon.child.kill("SIGTERM");
    // Before the fix the failed drain left the connection reconnecting, and the process lived on for ~30 s.
    const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 15_000).unref())]);
    expect(outcome).toEqual({ code: 0, signal: null });
  });
});
