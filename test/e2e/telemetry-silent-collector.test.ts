import { mkdtemp, rm } from "node:fs/promises";
import { createServer, type Server, type Socket } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { MAIN, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";
import { commonArgs, spawnServer, type SpawnedServer } from "./model-processes.js";

/**
 * An OTLP collector that accepts connections and never answers: the daemons' last export at
 * shutdown would retry for OTEL_EXPORTER_OTLP_TIMEOUT (10 s), past a supervisor's grace period
 * (docker stop's 10 s, the Gym launcher's 5 s). Their stop must not wait for it.
 */
const TOKEN = "silent-collector-token";
const deployment = `silentotlp${process.pid}`;
/** Well under the 8-10 s the retried export took, well over the 2 s bounded flush plus the stop. */
const STOP_BOUND_MS = 6000;
let nats: NatsFixture;
let root: string;
let collector: Server;
let collectorUrl: string;
const held: Socket[] = [];
let daemon: DaemonProcess | undefined;
let verifier: SpawnedServer | undefined;

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-silent-otlp-"));
  collector = createServer((socket) => {
    held.push(socket);
    socket.resume(); // reads the request, never answers
  });
  await new Promise<void>((resolve) => collector.listen(0, "127.0.0.1", resolve));
  collectorUrl = `http://127.0.0.1:${(collector.address() as { port: number }).port}`;
});

afterAll(async () => {
  await daemon?.kill("SIGKILL");
  await verifier?.kill("SIGKILL");
  for (const socket of held) socket.destroy();
  await new Promise((resolve) => collector.close(resolve));
  await nats?.close();
  await rm(root, { recursive: true, force: true });
});

/** Every signal exported over OTLP, often: a span and metrics are pending at shutdown. */
const silentOtlp = () => ({ OTEL_EXPORTER_OTLP_ENDPOINT: collectorUrl, OTEL_BSP_SCHEDULE_DELAY: "50", OTEL_METRIC_EXPORT_INTERVAL: "200" });

describe("daemons whose OTLP collector never answers", () => {
  it("the coordinator stops on SIGTERM without waiting out the last export (exit 0)", async () => {
    daemon = spawnDaemon(
      [MAIN, "coordinator", "--deployment", deployment, "--nats-url", nats.server.url, "--token", TOKEN, "--checkpoint-root", root, "--lease-ms", "300", "--no-http", "--log-level", "warn"],
      silentOtlp(),
    );
    const client = new NatsControllerClient({ nc: nats.nc, deployment, token: TOKEN, leaderWaitMs: 15_000 });
    await client.status();
    await expect(client.prepare({ checkpoint_id: "silent-1" })).rejects.toMatchObject({ code: "not_found" });
    const started = Date.now();
    await daemon.kill("SIGTERM");
    expect(await daemon.exited, daemon.stderr()).toEqual({ code: 0, signal: null });
    expect(Date.now() - started, daemon.stderr()).toBeLessThan(STOP_BOUND_MS);
    expect(held.length).toBeGreaterThan(0);
  }, 60_000);

  it("a participant (the math verifier) stops on SIGTERM without waiting out the last export (exit 0)", async () => {
    verifier = await spawnServer("verifier", "dist/participants/verifiers/main.js", ["--verifier", "math", ...commonArgs(nats.server.url, deployment, "math1", TOKEN), "--checkpoint-root", root], 20_000, { ...process.env, ...silentOtlp() });
    await fetch(`${verifier.url}/health`);
    const started = Date.now();
    await verifier.kill("SIGTERM");
    expect(await verifier.exited, verifier.output.join("\n")).toEqual({ code: 0, signal: null });
    expect(Date.now() - started, verifier.output.join("\n")).toBeLessThan(STOP_BOUND_MS);
  }, 60_000);
});
