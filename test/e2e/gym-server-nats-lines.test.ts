import { spawn } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * A participant whose NATS goes away says so (docs/operations.md "Reading the logs"): one
 * `nats_disconnected` warning, one `nats_reconnected` with how long it was down. Before, only its
 * heartbeat's failure spell hinted at it, and nothing said when the connection was back.
 */
let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

describe("a reference server's NATS connection lines", () => {
  it("warns once when NATS drops and says when it is back", { timeout: 60_000 }, async () => {
    ensureBuilt();
    const program = "dist/participants/gym/resources-server/main.js";
    const child = spawn(process.execPath, [program, "--nats", nats.server.url, "--deployment", "nats-lines", "--token", "t0ken", "--instance", "res_nats"], { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    const exited = new Promise((resolve) => child.once("exit", resolve));
    const lines = () => stdout.split("\n").filter((l) => l.startsWith('{"level"')).map((l) => JSON.parse(l) as Record<string, unknown>);
    try {
      await waitUntil(() => stdout.includes('"ready":true'), "ready", 20_000);
      await nats.server.kill();
      await waitUntil(() => lines().some((l) => l["msg"] === "nats_disconnected"), "nats_disconnected logged", 15_000);
      await nats.server.restart();
      await waitUntil(() => lines().some((l) => l["msg"] === "nats_reconnected"), "nats_reconnected logged", 20_000);
      expect(lines().filter((l) => l["msg"] === "nats_disconnected")).toEqual([expect.objectContaining({ level: 40, server: expect.any(String) })]);
      expect(lines().find((l) => l["msg"] === "nats_reconnected")).toMatchObject({ level: 30, down_s: expect.any(Number) });
    } finally {
      child.kill("SIGTERM");
      await exited;
    }
  });
});
