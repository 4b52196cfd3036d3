import { connect, type Socket } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { clearOtelEnv, restoreOtelEnv, unregisterOtelGlobals } from "../../support/otel-globals.js";
import { startTelemetry as coordinatorTelemetry } from "../../../coordinator/telemetry/telemetry-sdk.js";
import { startTelemetry as participantTelemetry } from "../../../participants/telemetry/telemetry-sdk.js";

/**
 * docs/telemetry.md: on stop a process flushes for at most 2 s, then exits. The /metrics server's
 * close waited for every connection that held no finished request: one opened and left silent (a
 * browser's preconnect, a load balancer's pool, a scan) or one whose request never finished its
 * headers kept shutdown() pending, and the stopped daemon alive, until the peer hung up.
 */
const saved = { ...process.env };
const sockets: Socket[] = [];
afterEach(() => {
  unregisterOtelGlobals();
  for (const socket of sockets.splice(0)) socket.destroy();
  restoreOtelEnv(saved);
});

function open(url: string, send: string): Promise<Socket> {
  const { hostname, port } = new URL(url);
  return new Promise((resolve, reject) => {
    const socket = connect(Number(port), hostname, () => {
      if (send) socket.write(send);
      resolve(socket);
    });
    sockets.push(socket);
    socket.once("error", reject);
  });
}

/** How long shutdown() may take here: its 2 s flush bound, with room for a loaded machine. */
const BOUND_MS = 6_000;

describe.each([
  ["coordinator", coordinatorTelemetry],
  ["participants", participantTelemetry],
])("startTelemetry (%s): shutdown with connections open to /metrics", (_side, start) => {
  it("ends within its bound and closes a silent connection and one with an unfinished request", async () => {
    clearOtelEnv();
    const handle = await start({ serviceName: "unit", metricsPort: 0 });
    const silent = await open(handle.metricsUrl!, "");
    const partial = await open(handle.metricsUrl!, "GET /metrics HTTP/1.1\r\nHost: x\r\n");
    const closed = [silent, partial].map((socket) => new Promise<void>((resolve) => socket.once("close", () => resolve())));
    let timer: NodeJS.Timeout | undefined;
    const outcome = await Promise.race([
      handle.shutdown().then(() => "stopped"),
      new Promise<string>((resolve) => (timer = setTimeout(() => resolve("still waiting"), BOUND_MS))),
    ]);
    clearTimeout(timer);
    expect(outcome).toBe("stopped");
    await Promise.all(closed);
  }, 20_000);
});
