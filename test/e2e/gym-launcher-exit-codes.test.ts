import { spawn } from "node:child_process";
import { readFileSync, readdirSync } from "node:fs";
import { createServer, type Server } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { alive, killAll, TrackedProcesses } from "../support/process-tree.js";
import { waitUntil } from "../support/wait-until.js";

/**
 * docs/operations.md: exit 2 is configuration, which a supervisor does not restart; exit 1 is
 * restarted. A server of `gym-ckpt gym` that refuses its configuration at start-up (a metrics port
 * it cannot listen on, a value it cannot parse) exits 2; the launcher passed that on as exit 1, so
 * a supervisor restarted the whole Gym for ever on a port that stays taken.
 */
let nats: NatsFixture;
let taken: Server;
let port: number;
const seen = new TrackedProcesses();

/** Live processes whose command line names `deployment` (the launcher's servers carry `--deployment <it>`). */
function serversOf(deployment: string): number[] {
  const found: number[] = [];
  for (const entry of readdirSync("/proc")) {
    const pid = Number(entry);
    if (!Number.isInteger(pid) || pid === process.pid) continue;
    try {
      if (readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0").includes(deployment) && alive(pid)) found.push(pid);
    } catch {
      // gone meanwhile
    }
  }
  return found;
}

beforeAll(async () => {
  nats = await startNats();
  taken = createServer();
  await new Promise<void>((resolve) => taken.listen(0, "127.0.0.1", () => resolve()));
  port = (taken.address() as { port: number }).port;
});
afterAll(async () => {
  killAll(seen);
  await new Promise((resolve) => taken?.close(resolve));
  await nats?.close();
});

describe("gym-ckpt gym: a server's configuration refusal at start-up", () => {
  it.each([
    { why: "a metrics port another process holds", value: () => String(port), line: () => `policy-backend: invalid_request: --metrics-port ${port}: cannot listen on 127.0.0.1:${port} (EADDRINUSE: address already in use)` },
    { why: "a metrics port that is not a number", value: () => "abc", line: () => "invalid configuration: metricsPort: must be a decimal port number" },
  ])("OTEL_EXPORTER_PROMETHEUS_PORT naming $why: the command exits 2 (not restarted), its servers all stopped", { timeout: 60_000 }, async ({ value, line }) => {
    const deployment = `exitcode${process.pid}${value()}`;
    const gym = spawn(process.execPath, ["dist/coordinator/cli/main.js", "gym", "--nats", nats.server.url, "--deployment", deployment, "--token", "t0ken"], {
      stdio: ["ignore", "pipe", "pipe"],
      env: { ...process.env, OTEL_EXPORTER_PROMETHEUS_PORT: value() },
    });
    seen.add(gym.pid!);
    let stderr = "";
    gym.stderr!.on("data", (chunk) => (stderr += String(chunk)));
    const watch = setInterval(() => serversOf(deployment).forEach((pid) => seen.add(pid)), 20);
    const code = await new Promise<number | null>((resolve) => gym.once("exit", (exitCode) => resolve(exitCode)));
    clearInterval(watch);
    expect(stderr).toContain(line());
    await waitUntil(() => serversOf(deployment).length === 0, "every server of the gym to exit");
    expect(code).toBe(2);
  });
});
