import { createServer } from "node:net";
import type { AddressInfo } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { GYM_PROCESSES, launchGym, type Gym } from "../../participants/gym/gym-launcher.js";
import { startNats, type NatsFixture } from "../support/nats.js";

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

/** A port the kernel just handed out; the next few above it are very likely free too. */
async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", () => resolve()));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((resolve) => server.close(() => resolve()));
  return port;
}

describe("gym launcher with OTEL_EXPORTER_PROMETHEUS_PORT", () => {
  it("starts every child, each serving /metrics on base + its index", async () => {
    const base = await freePort();
    gym = await launchGym({ nats: nats.server.url, deployment: "metrics", token: "t0ken", env: { OTEL_EXPORTER_PROMETHEUS_PORT: String(base) } });
    expect([...gym.processes.keys()].sort()).toEqual([...GYM_PROCESSES].sort());
    for (const [index, name] of GYM_PROCESSES.entries()) {
      const metricsUrl = gym.processes.get(name)!.metricsUrl;
      expect(metricsUrl).toBe(`http://127.0.0.1:${base + index}/metrics`);
      expect((await fetch(metricsUrl!)).status).toBe(200);
    }
  });
});
