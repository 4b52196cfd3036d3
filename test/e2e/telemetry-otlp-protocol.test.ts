import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { startOtlpReceiver, type OtlpReceiver } from "../support/otlp-receiver.js";
import { waitUntil } from "../support/wait-until.js";
import { MAIN, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/**
 * docs/telemetry.md: "OTLP uses JSON encoding by default. Set OTEL_EXPORTER_OTLP_PROTOCOL ... and the
 * SDK's own environment handling picks the exporter instead." With http/protobuf (or grpc, whose
 * collector port takes no HTTP JSON at all) the metrics must follow it too, not stay OTLP/HTTP JSON.
 */
let nats: NatsFixture;
let receiver: OtlpReceiver;
let root: string;
let daemon: DaemonProcess | undefined;
/** Further daemons a test starts, stopped after all. */
const daemons: DaemonProcess[] = [];

beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
  receiver = await startOtlpReceiver();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-otlp-proto-"));
}, 30_000);

afterAll(async () => {
  await daemon?.kill("SIGTERM").catch(() => undefined);
  await Promise.all(daemons.map((d) => d.kill("SIGTERM").catch(() => undefined)));
  await receiver?.close().catch(() => undefined);
  await nats?.close().catch(() => undefined);
  if (root) await rm(root, { recursive: true, force: true });
});

describe("OTEL_EXPORTER_OTLP_PROTOCOL", () => {
  it("http/protobuf: the coordinator's metrics are not sent as OTLP/HTTP JSON", async () => {
    daemon = spawnDaemon(
      [MAIN, "coordinator", "--deployment", `proto${process.pid}`, "--nats-url", nats.server.url, "--token", "proto-token", "--checkpoint-root", root, "--no-http", "--log-level", "warn"],
      { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url, OTEL_EXPORTER_OTLP_PROTOCOL: "http/protobuf", OTEL_METRIC_EXPORT_INTERVAL: "500" },
    );
    const until = Date.now() + 15_000;
    while (receiver.rejected() + receiver.metricNames().size === 0 && Date.now() < until) await new Promise((resolve) => setTimeout(resolve, 100));
    expect(receiver.rejected() + receiver.metricNames().size, daemon.stderr()).toBeGreaterThan(0);
    // JSON metric bodies land in metricNames(); protobuf ones are counted as rejected().
    expect([...receiver.metricNames()]).toEqual([]);
  }, 30_000);
});

/**
 * --otlp-endpoint (docs/telemetry.md, "Turning it on"), like every other flag, wins over the
 * environment: the endpoint given on the command line is used, not one an inherited
 * OTEL_EXPORTER_OTLP_[METRICS_]ENDPOINT (a pod's default collector) names.
 */
describe("--otlp-endpoint", () => {
  it("wins over an inherited OTEL_EXPORTER_OTLP_ENDPOINT", async () => {
    // A root of its own: the first test's coordinator claimed `root` for its deployment.
    const flagged = spawnDaemon(
      [MAIN, "coordinator", "--deployment", `of${process.pid}`, "--nats-url", nats.server.url, "--token", "tok", "--checkpoint-root", join(root, "of"), "--no-http", "--lease-ms", "500", "--log-level", "warn", "--otlp-endpoint", receiver.url],
      // Port 9 (discard): nobody listens there.
      { OTEL_EXPORTER_OTLP_ENDPOINT: "http://127.0.0.1:9", OTEL_EXPORTER_OTLP_METRICS_ENDPOINT: "http://127.0.0.1:9/v1/metrics", OTEL_METRIC_EXPORT_INTERVAL: "300", OTEL_SERVICE_NAME: "" },
    );
    daemons.push(flagged);
    await waitUntil(() => receiver.metricNames().has("gym_ckpt.coordinator.leader"), `the coordinator's metrics at --otlp-endpoint (stderr: ${flagged.stderr()})`, 15_000);
  }, 30_000);
});
