import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { GYM_PROCESSES, launchGym, type Gym } from "../../participants/gym/gym-launcher.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { freePortRun } from "../support/ports.js";

/** OTEL_EXPORTER_PROMETHEUS_PORT for the whole Gym: one /metrics port per child, not one shared. */
let nats: NatsFixture;
let gym: Gym | undefined;

beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await gym?.stop();
  await nats?.close();
});

describe("gym launcher with OTEL_EXPORTER_PROMETHEUS_PORT", () => {
  it("starts every child, each serving /metrics on base + its index", async () => {
    const base = await freePortRun(GYM_PROCESSES.length);
    gym = await launchGym({ nats: nats.server.url, deployment: "metrics", token: "t0ken", env: { OTEL_EXPORTER_PROMETHEUS_PORT: String(base) } });
    expect([...gym.processes.keys()].sort()).toEqual([...GYM_PROCESSES].sort());
    for (const [index, name] of GYM_PROCESSES.entries()) {
      const metricsUrl = gym.processes.get(name)!.metricsUrl;
      expect(metricsUrl).toBe(`http://127.0.0.1:${base + index}/metrics`);
      expect((await fetch(metricsUrl!)).status).toBe(200);
    }
  });
});
