import { readFile } from "node:fs/promises";
import { createServer } from "node:net";
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

/** Whether 127.0.0.1:`port` can be bound now. */
function bindable(port: number): Promise<boolean> {
  const server = createServer();
  return new Promise((resolve) => {
    server.once("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
  });
}

/**
 * A base port with `count` free ports from it, below the kernel's ephemeral range: there only
 * explicit binds take ports, while above it any test's outgoing connection (or server on port 0)
 * may take one between this check and the children's binds.
 */
async function freePortRun(count: number): Promise<number> {
  const range = await readFile("/proc/sys/net/ipv4/ip_local_port_range", "utf8").catch(() => "32768 60999");
  const low = Number(range.trim().split(/\s+/)[0]);
  for (let tries = 0; tries < 50; tries++) {
    const base = 10_000 + Math.floor(Math.random() * (low - 10_000 - count));
    const free = await Promise.all(Array.from({ length: count }, (_, i) => bindable(base + i)));
    if (free.every(Boolean)) return base;
  }
  throw new Error("no run of free ports below the ephemeral range");
}

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
