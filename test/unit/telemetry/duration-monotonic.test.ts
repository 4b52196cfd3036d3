import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { metrics } from "@opentelemetry/api";
import type { HistogramMetricData } from "@opentelemetry/sdk-metrics";
import { afterAll, describe, expect, it } from "vitest";
import { inMemoryMetrics } from "../../support/in-memory-metrics.js";
import { makeEngine } from "../coordinator/fake-participants.js";

const { meterProvider, collect } = inMemoryMetrics();
metrics.setGlobalMeterProvider(meterProvider);

afterAll(async () => {
  metrics.disable();
  await meterProvider.shutdown();
});

async function histogram(name: string): Promise<HistogramMetricData> {
  return (await collect()).find((m) => m.descriptor.name === name) as HistogramMetricData;
}

describe("the coordinator's durations", () => {
  it("are measured on the monotonic clock: a wall-clock step back by an hour during a checkpoint records no hour (nor a negative value the SDK drops)", async () => {
    const root = await mkdtemp(join(tmpdir(), "gym-ckpt-duration-"));
    try {
      const { engine, clock } = makeEngine(root);
      const wall = clock.now.bind(clock);
      let stepped = false;
      // The first wall reading of the op is before the step, every later one an hour earlier.
      clock.now = () => {
        const now = wall() - (stepped ? 3_600_000 : 0);
        stepped = true;
        return now;
      };
      await engine.checkpoint({ checkpoint_id: "c1", episode_ids: null, stop: false, controller_state: null });
      for (const name of ["gym_ckpt.coordinator.op.duration", "gym_ckpt.coordinator.request.duration"]) {
        const points = (await histogram(name)).dataPoints;
        expect(points.length, name).toBeGreaterThan(0);
        for (const point of points) {
          expect(point.value.min, name).toBeGreaterThanOrEqual(0);
          expect(point.value.max, name).toBeLessThan(60);
        }
      }
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
