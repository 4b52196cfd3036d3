import { readFile } from "node:fs/promises";
import { createServer } from "node:net";

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
export async function freePortRun(count: number): Promise<number> {
  const range = await readFile("/proc/sys/net/ipv4/ip_local_port_range", "utf8").catch(() => "32768 60999");
  const low = Number(range.trim().split(/\s+/)[0]);
  for (let tries = 0; tries < 50; tries++) {
    const base = 10_000 + Math.floor(Math.random() * (low - 10_000 - count));
    const free = await Promise.all(Array.from({ length: count }, (_, i) => bindable(base + i)));
    if (free.every(Boolean)) return base;
  }
  throw new Error("no run of free ports below the ephemeral range");
}

/** A loopback port nothing listens on now (taken and released). */
export async function closedPort(): Promise<number> {
  const probe = createServer();
  await new Promise<void>((resolve) => probe.listen(0, "127.0.0.1", resolve));
  const { port } = probe.address() as { port: number };
  await new Promise<void>((resolve) => probe.close(() => resolve()));
  return port;
}
