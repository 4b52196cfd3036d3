import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { startOtlpReceiver, type OtlpReceiver } from "../support/otlp-receiver.js";
import { waitUntil } from "../support/wait-until.js";
import { MAIN, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * `--otlp-endpoint` (docs/telemetry.md, "Turning it on"), like every other flag, wins over the
 * environment: the endpoint given on the command line is used, not one an inherited
 * OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT (a pod's default collector) names.
 */
let nats: NatsFixture;
let receiver: OtlpReceiver;
let root: string;
let daemon: DaemonProcess | undefined;

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  receiver = await startOtlpReceiver();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-otlpflag-"));
}, 30_000);

afterAll(async () => {
  await daemon?.kill("SIGTERM").catch(() => undefined);
  await nats?.close().catch(() => undefined);
  await receiver?.close().catch(() => undefined);
  if (root) await rm(root, { recursive: true, force: true });
});

describe("--otlp-endpoint", () => {
  it("wins over an inherited OTEL_EXPORTER_OTLP_ENDPOINT", async () => {
    daemon = spawnDaemon(
      [MAIN, "coordinator", "--deployment", `of${process.pid}`, "--nats-url", nats.server.url, "--token", "tok", "--checkpoint-root", root, "--no-http", "--lease-ms", "500", "--log-level", "warn", "--otlp-endpoint", receiver.url],
      // Port 9 (discard): nobody listens there.
      { OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:9", OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: "http://127.0.0.1:9/v1/metrics", OTEL_METRIC_EXPORT_INTERVAL: "300", OTEL_SERVICE_NAME: "" },
    );
    await waitUntil(() => receiver.metricNames().has("gym_ckpt.coordinator.leader"), `the coordinator's metrics at --otlp-endpoint (stderr: ${daemon.stderr()})`, 15_000);
  }, 30_000);
});
