import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { NatsControllerClient } from "../../coordinator/client/nats-controller-client.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { startOtlpReceiver, type OtlpReceiver } from "../support/otlp-receiver.js";
import { waitUntil } from "../support/wait-until.js";
import { MAIN, ensureBuilt, spawnDaemon, type DaemonProcess } from "./coordinator-process.js";

/** A coordinator started without --coordinator-id exports the id it generated as service.instance.id. */
const TOKEN = "instance-id-token";
let receiver: OtlpReceiver;
let nats: NatsFixture;
let root: string;
let daemon: DaemonProcess | undefined;
const deployment = `instid${process.pid}`;

beforeAll(async () => {
  ensureBuilt();
  receiver = await startOtlpReceiver();
  nats = await startNats();
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-instid-"));
  daemon = spawnDaemon(
    [MAIN, "coordinator", "--deployment", deployment, "--nats-url", nats.server.url, "--token", TOKEN, "--checkpoint-root", root, "--lease-ms", "300", "--no-http", "--log-level", "warn"],
    { OTEL_EXPORTER_OTLP_ENDPOINT: receiver.url, OTEL_BSP_SCHEDULE_DELAY: "50", OTEL_METRICS_EXPORTER: "none", OTEL_SERVICE_NAME: "" },
  );
});

afterAll(async () => {
  await daemon?.kill("SIGTERM").catch(() => undefined);
  await nats?.close().catch(() => undefined);
  await receiver?.close().catch(() => undefined);
  if (root) await rm(root, { recursive: true, force: true });
});

describe("coordinator telemetry resource", () => {
  it("service.instance.id is the generated coordinator id when none is configured", async () => {
    const client = new NatsControllerClient({ nc: nats.nc, deployment, token: TOKEN, leaderWaitMs: 15_000 });
    const { coordinator } = await client.status();
    expect(coordinator.id).toMatch(/-\d+-[0-9a-f]{6}$/);
    // Any op makes a span: with no participant registered, a prepare is refused (not_found).
    await expect(client.prepare({ checkpoint_id: "instid-1" })).rejects.toMatchObject({ code: "not_found" });
    await waitUntil(() => receiver.spans().some((s) => s.name === "checkpoint.coordinate.prepare"), "the prepare span", 10_000);
    const span = receiver.spans().find((s) => s.name === "checkpoint.coordinate.prepare")!;
    expect(span.service).toBe("gym-ckpt-coordinator");
    expect(span.instanceId).toBe(coordinator.id);
  });
});
