import { metrics } from "@opentelemetry/api";
import { AggregationTemporality, InMemoryMetricExporter, MeterProvider, PeriodicExportingMetricReader } from "@opentelemetry/sdk-metrics";
import { afterAll, describe, expect, it } from "vitest";
import { observeLeadership, type ObservedLeadership } from "../../../coordinator/telemetry/telemetry-sdk.js";

/** Cumulative, as the Prometheus exporter reads it. */
const exporter = new InMemoryMetricExporter(AggregationTemporality.CUMULATIVE);
const reader = new PeriodicExportingMetricReader({ exporter, exportIntervalMillis: 60_000 });
const meterProvider = new MeterProvider({ readers: [reader] });
metrics.setGlobalMeterProvider(meterProvider);

afterAll(async () => {
  metrics.disable();
  await meterProvider.shutdown();
});

async function gauges(): Promise<Record<string, number[]>> {
  await reader.forceFlush();
  const latest = exporter.getMetrics().at(-1)!;
  const all = latest.scopeMetrics.flatMap((s) => s.metrics);
  return Object.fromEntries(all.map((m) => [m.descriptor.name, m.dataPoints.map((p) => p.value as number)]));
}

describe("leadership gauges", () => {
  it("the epoch gauge drops to 0 when the lease is lost instead of repeating the old epoch", async () => {
    let state: ObservedLeadership = { leader: true, ready: true, epoch: 7 };
    const stop = observeLeadership(() => state);
    try {
      expect(await gauges()).toMatchObject({ "gym_ckpt.coordinator.leader.epoch": [7], "gym_ckpt.coordinator.leader": [1] });
      state = { leader: false, ready: false, epoch: null };
      expect(await gauges()).toMatchObject({ "gym_ckpt.coordinator.leader.epoch": [0], "gym_ckpt.coordinator.leader": [0] });
      state = { leader: true, ready: false, epoch: 12 };
      expect(await gauges()).toMatchObject({ "gym_ckpt.coordinator.leader.epoch": [12], "gym_ckpt.coordinator.leader": [0] });
    } finally {
      stop();
    }
  });
});
