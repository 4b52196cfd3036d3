import { metrics } from "@opentelemetry/api";
import { afterAll, describe, expect, it } from "vitest";
import { observeLeadership, type ObservedLeadership } from "../../../coordinator/telemetry/telemetry-sdk.js";
import { inMemoryMetrics } from "../../support/in-memory-metrics.js";

const { meterProvider, collect } = inMemoryMetrics();
metrics.setGlobalMeterProvider(meterProvider);

afterAll(async () => {
  metrics.disable();
  await meterProvider.shutdown();
});

async function gauges(): Promise<Record<string, number[]>> {
  const all = await collect();
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
