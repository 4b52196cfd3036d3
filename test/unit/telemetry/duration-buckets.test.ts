import { metrics } from "@opentelemetry/api";
import { DataPointType, type HistogramMetricData } from "@opentelemetry/sdk-metrics";
import { afterAll, describe, expect, it } from "vitest";
import { coordinatorTelemetry } from "../../../coordinator/telemetry/coordinator-telemetry.js";
import { participantInstruments, useTelemetryProviders } from "../../../participants/telemetry/instruments.js";
import { DURATION_BUCKETS_S } from "../../../protocol/index.js";
import { inMemoryMetrics } from "../../support/in-memory-metrics.js";

/** The coordinator's instruments come from the global meter provider, the participants' from the injected one. */
const { meterProvider, collect } = inMemoryMetrics();
metrics.setGlobalMeterProvider(meterProvider);
useTelemetryProviders({ meterProvider });

afterAll(async () => {
  useTelemetryProviders({});
  metrics.disable();
  await meterProvider.shutdown();
});

async function histogram(name: string): Promise<HistogramMetricData> {
  const metric = (await collect()).find((m) => m.descriptor.name === name);
  expect(metric?.dataPointType, name).toBe(DataPointType.HISTOGRAM);
  return metric as HistogramMetricData;
}

/** The upper boundary of the bucket holding the one observation. */
function bucketOf(metric: HistogramMetricData): number {
  const { boundaries, counts } = metric.dataPoints[0]!.value.buckets;
  const index = counts.findIndex((n) => n > 0);
  return boundaries[index] ?? Infinity;
}

describe("duration histograms in seconds", () => {
  it("put a 20 ms observation in a bucket of at most 25 ms (not the SDK's millisecond buckets)", async () => {
    coordinatorTelemetry().opDuration.record(0.02, { op: "checkpoint", outcome: "ok" });
    coordinatorTelemetry().requestDuration.record(0.02, { op: "prepare", kind: "model", outcome: "ok" });
    participantInstruments().opDuration.record(0.02, { op: "prepare", kind: "model", outcome: "ok" });
    participantInstruments().pause.record(0.02, { kind: "model", participant: "m" });
    for (const name of ["gym_ckpt.coordinator.op.duration", "gym_ckpt.coordinator.request.duration", "gym_ckpt.participant.op.duration", "gym_ckpt.participant.pause.duration"]) {
      const metric = await histogram(name);
      expect(metric.dataPoints[0]!.value.buckets.boundaries, name).toEqual(DURATION_BUCKETS_S);
      const upper = bucketOf(metric);
      expect(upper, name).toBeGreaterThanOrEqual(0.02);
      expect(upper, name).toBeLessThanOrEqual(0.025);
    }
  });
});
