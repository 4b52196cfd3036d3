import { trace } from "@opentelemetry/api";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { clearOtelEnv, restoreOtelEnv, unregisterOtelGlobals } from "../../support/otel-globals.js";
import { startTelemetry } from "../../../coordinator/telemetry/telemetry-sdk.js";
import { startOtlpReceiver, type OtlpReceiver } from "../../support/otlp-receiver.js";

/**
 * docs/telemetry.md: "OTLP uses JSON encoding by default." OTEL_TRACES_EXPORTER=otlp (the spec's own
 * default value, often set explicitly) names the exporter, not its encoding: without a protocol
 * variable the traces must go out as JSON like the metrics, not as the SDK's own default, protobuf.
 */
let receiver: OtlpReceiver;
const saved = { ...process.env };
beforeAll(async () => {
  receiver = await startOtlpReceiver();
});
afterAll(async () => {
  unregisterOtelGlobals();
  restoreOtelEnv(saved);
  await receiver.close();
});

describe("OTEL_TRACES_EXPORTER=otlp without a protocol", () => {
  it("sends the traces as OTLP/HTTP JSON", async () => {
    clearOtelEnv();
    process.env.OTEL_TRACES_EXPORTER = "otlp";
    process.env.OTEL_METRICS_EXPORTER = "none";
    process.env.OTEL_EXPORTER_OTLP_ENDPOINT = receiver.url;
    const handle = await startTelemetry({ serviceName: "gym-ckpt-unit" });
    expect(handle.tracing).toBe(true);
    trace.getTracer("gym-ckpt").startSpan("encoded.as.json").end();
    await handle.shutdown(); // flushes the batch
    expect(receiver.rejected()).toBe(0);
    expect(receiver.spans().map((s) => s.name)).toContain("encoded.as.json");
  });
});
