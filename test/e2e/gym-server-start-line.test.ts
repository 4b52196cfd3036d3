import { spawn } from "node:child_process";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { PACKAGE_VERSION } from "../../protocol/index.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { waitUntil } from "../support/wait-until.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * A reference server's first log line is what an on-call engineer reads to tell which build serves
 * which deployment as which instance, on which address and NATS server (docs/operations.md
 * "Reading the logs"). Before, the agent and environment servers logged no start line at all, and no server
 * named its version or deployment.
 */
let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

describe("a reference server's start line", () => {
  it.each([
    ["resources-server", "dist/participants/gym/resources-server/main.js"],
    ["policy-backend", "dist/participants/gym/policy-backend/main.js"],
  ])("%s: names its version, deployment, instance, URL and NATS server", async (name, program) => {
    ensureBuilt();
    const child = spawn(process.execPath, [program, "--nats", nats.server.url, "--deployment", "start-line", "--token", "t0ken", "--instance", `${name}_x`], { stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    const exited = new Promise((resolve) => child.once("exit", resolve));
    try {
      // The start line may come just after the ready line (the policy backend writes it second).
      await waitUntil(() => stdout.includes('"ready":true') && stdout.includes('"msg":"started"'), `${name} ready and its start line`, 20_000);
      const ready = JSON.parse(stdout.split("\n").find((l) => l.includes('"ready":true'))!) as { url: string };
      const lines = stdout.split("\n").filter((l) => l.startsWith('{"level"')).map((l) => JSON.parse(l) as Record<string, unknown>);
      expect(lines.find((l) => l["msg"] === "started")).toMatchObject({
        level: 30,
        name,
        version: PACKAGE_VERSION,
        deployment: "start-line",
        instance: `${name}_x`,
        url: ready.url,
        nats: new URL(nats.server.url).host,
      });
    } finally {
      child.kill("SIGTERM");
      await exited;
    }
  });
});
