import { spawn } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * A reference server stopped while its NATS is down (a host shutting down, NATS stopped first)
 * must finish its stop well inside the Gym launcher's 5 s grace before SIGKILL, or its telemetry
 * flush and clean exit are lost. Its membership entry's delete waited out the JetStream request
 * timeout (5 s), then the drain: about 5.5 s, and the heartbeat could still log after
 * "shutting down".
 */
let nats: NatsFixture;
beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

describe("a reference server's stop with NATS down", () => {
  it("exits 0 within 2.5 s of SIGTERM, nothing about its heartbeat logged after 'shutting down'", { timeout: 60_000 }, async () => {
    const program = "dist/participants/gym/resources-server/main.js";
    const child = spawn(process.execPath, [program, "--nats", nats.server.url, "--deployment", "stop-no-nats", "--token", "t0ken", "--instance", "res_stop"], { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => child.once("exit", (code, signal) => resolve({ code, signal })));
    const lines = () => stdout.split("\n").filter((l) => l.startsWith('{"level"')).map((l) => JSON.parse(l) as Record<string, unknown>);
    try {
      await waitUntil(() => stdout.includes('"ready":true'), "ready", 20_000);
      await nats.server.kill();
      await waitUntil(() => lines().some((l) => l["msg"] === "nats_disconnected"), "nats_disconnected logged", 15_000);
      const signalled = performance.now();
      child.kill("SIGTERM");
      const outcome = await Promise.race([exited, new Promise<"still running">((resolve) => setTimeout(() => resolve("still running"), 10_000).unref())]);
      const tookMs = performance.now() - signalled;
      expect(outcome).toEqual({ code: 0, signal: null });
      expect(tookMs).toBeLessThan(2_500);
      const logged = lines();
      const stopAt = logged.findIndex((l) => l["msg"] === "shutting down");
      expect(stopAt).toBeGreaterThanOrEqual(0);
      expect(logged.slice(stopAt + 1).filter((l) => /heartbeat/.test(String(l["msg"])))).toEqual([]);
    } finally {
      if (child.exitCode === null && child.signalCode === null) child.kill("SIGKILL");
      await exited;
    }
  });
});
