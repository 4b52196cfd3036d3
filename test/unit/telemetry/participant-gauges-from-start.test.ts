import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { useTelemetryProviders } from "../../../participants/telemetry/instruments.js";
import { inMemoryMetrics } from "../../support/in-memory-metrics.js";

/**
 * docs/telemetry.md: `gym_ckpt.participant.state` and `gym_ckpt.participant.blockers` are the
 * kind's current readiness counts. A dashboard (held responses, blockers) needs them from the
 * moment a participant runs, not only once its first checkpoint op or refusal has happened.
 */
const { meterProvider, collect } = inMemoryMetrics();
let root: string;

beforeAll(async () => {
  useTelemetryProviders({ meterProvider });
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-gauges-"));
});
afterAll(async () => {
  useTelemetryProviders({});
  await meterProvider.shutdown();
  await rm(root, { recursive: true, force: true });
});

describe("participant state gauges", () => {
  it("are observed from the control plane's start, before any checkpoint op", async () => {
    const kind = new ScriptableKind("environment");
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    const plane = new ParticipantControlPlane({ adapter: kind, instance: "env-fresh", checkpointRoot: root });
    try {
      const metrics = new Map((await collect()).map((m) => [m.descriptor.name, m]));
      const blockers = metrics.get("gym_ckpt.participant.blockers")?.dataPoints.find((p) => p.attributes.participant === "env-fresh");
      expect(blockers?.attributes).toEqual({ kind: "environment", participant: "env-fresh" });
      const episodes = metrics.get("gym_ckpt.participant.state")?.dataPoints.find((p) => p.attributes.participant === "env-fresh" && p.attributes.name === "episodes");
      expect(episodes?.value).toBe(1);
    } finally {
      plane.dispose();
    }
  });
});
