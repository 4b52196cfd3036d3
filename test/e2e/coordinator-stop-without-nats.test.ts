import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import { NatsServerProcess, startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";
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
    daemon = spawnDaemon([MAIN, "coordinator", "--deployment", deployment, "--nats-url", nats!.server.url, "--token", TOKEN, "--checkpoint-root", root, "--lease-ms", "300", "--no-http", "--log-level", "info"]);
    const client = new NatsControllerClient({ nc: nats!.nc, deployment, token: TOKEN, leaderWaitMs: 15_000 });
    expect((await client.status()).coordinator.leader).toBe(true);
    await nats!.close();
    nats = undefined;
    daemon.child.kill("SIGTERM");
    // Before the fix the failed drain left the connection reconnecting, and the process lived on for ~30 s.
    const outcome = await Promise.race([daemon.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 15_000).unref())]);
    expect(outcome).toEqual({ code: 0, signal: null });
    // Its last line says why it stopped.
    expect(daemon.stdout()).toMatch(/"reason":"SIGTERM","msg":"coordinator_stopped"/);
  });

  it("exits 1 when NATS closes its connection for good, with its HTTP API on (credentials revoked by a reload)", async () => {
    // nats.js gives up a connection whose reconnects the server refuses for its credentials: the
    // daemon logs nats_connection_closed and must exit 1 for its supervisor to restart it. Its HTTP
    // server kept the process alive before, answering /healthz ok, so no liveness probe restarted it.
    const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-revoked-"));
    const conf = join(dir, "nats.conf");
    const users = (pass: string) => `authorization { users = [ { user: "coord", password: "${pass}" } ] }\n`;
    await writeFile(conf, users("first-pass"));
    const server = await NatsServerProcess.start({ args: ["-c", conf] });
    let revoked: DaemonProcess | undefined;
    try {
      revoked = spawnDaemon(
        [MAIN, "coordinator", "--deployment", `${deployment}r`, "--nats-url", server.url, "--token", TOKEN, "--checkpoint-root", join(dir, "root"), "--lease-ms", "300", "--http-port", "0", "--log-level", "warn"],
        { GYM_CKPT_NATS_USER: "coord", GYM_CKPT_NATS_PASS: "first-pass" },
      );
      const started = revoked;
      await waitUntil(() => /^http http:\/\//m.test(started.stdout()), "the daemon to serve HTTP", 20_000);
      await writeFile(conf, users("second-pass"));
      process.kill(server.pid!, "SIGHUP");
      const outcome = await Promise.race([revoked.exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 20_000).unref())]);
      expect(outcome).toEqual({ code: 1, signal: null });
      // With what closed it, and the stop that follows says so too.
      expect(revoked.stdout()).toMatch(/"err":\{[^\n]*"message":"[^"\n]*[Aa]uthorization[^\n]*"msg":"nats_connection_closed"/);
    } finally {
      await revoked?.kill().catch(() => undefined);
      await server.dispose();
      await rm(dir, { recursive: true, force: true });
    }
  });
});
