import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import type { HistogramMetricData } from "@opentelemetry/sdk-metrics";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { systemClock, type Clock } from "../../../participants/control-plane/clock.js";
import { useTelemetryProviders } from "../../../participants/telemetry/instruments.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";
import { inMemoryMetrics } from "../../support/in-memory-metrics.js";

const { meterProvider, collect } = inMemoryMetrics();
let root: string;

beforeAll(async () => {
  useTelemetryProviders({ meterProvider });
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-part-duration-"));
});
afterAll(async () => {
  useTelemetryProviders({});
  await meterProvider.shutdown();
  await rm(root, { recursive: true, force: true });
});

async function histogram(name: string): Promise<HistogramMetricData | undefined> {
  return (await collect()).find((m) => m.descriptor.name === name) as HistogramMetricData | undefined;
}

describe("the participant's durations", () => {
  it("are measured on the monotonic clock: a wall-clock step back by an hour during an op or a pause records no hour (nor a negative value the SDK drops)", async () => {
    // Every wall reading is an hour earlier than the one before (NTP stepping the clock back).
    let reads = 0;
    const clock: Clock = { ...systemClock, now: () => Date.now() - 3_600_000 * reads++ };
    const kind = new ScriptableKind("environment");
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    const plane = new ParticipantControlPlane({ adapter: kind, instance: "env-step", checkpointRoot: root, clock });
    const deadline = () => Date.now() / 1000 + 30;
    try {
      await plane.handle("prepare", { checkpoint_id: "s-c1", deadline_ts: deadline(), epoch: 1 } as never);
      createCheckpointDir(root, "s-c1");
      await plane.handle("commit", { checkpoint_id: "s-c1", deadline_ts: deadline(), epoch: 1, checkpoint_dir: join(root, "s-c1"), episode_ids: null, stop: false } as never);
      await plane.handle("resume", { checkpoint_id: "s-c1", deadline_ts: deadline(), epoch: 1 } as never);
      for (const name of ["gym_ckpt.participant.pause.duration", "gym_ckpt.participant.op.duration"]) {
        const points = (await histogram(name))?.dataPoints.filter((p) => p.attributes.kind === "environment") ?? [];
        const count = points.reduce((n, p) => n + p.value.count, 0);
        expect(count, `${name} count`).toBe(name.includes("pause") ? 1 : 3);
        for (const point of points) {
          expect(point.value.min, name).toBeGreaterThanOrEqual(0);
          expect(point.value.max, name).toBeLessThan(60);
        }
      }
    } finally {
      plane.dispose();
    }
  });
});
