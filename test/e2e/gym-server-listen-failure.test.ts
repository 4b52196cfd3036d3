import { spawnSync } from "node:child_process";
import { createServer, type Server } from "node:net";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startNats, type NatsFixture } from "../support/nats.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * A reference server whose port is taken cannot start. It must say so in one line with a catalog
 * code and exit 1 (docs/gym.md), as the coordinator does, not die on an unhandled rejection with a
 * stack trace; the line keeps EADDRINUSE and the port, which the Gym launcher looks for. Its
 * --metrics-port taken is configuration, invalid_request exit 2: metrics-port-refusal.test.ts.
 */
let nats: NatsFixture;
let taken: Server;
let port: number;
beforeAll(async () => {
  nats = await startNats();
  taken = createServer();
  await new Promise<void>((resolve) => taken.listen(0, "127.0.0.1", () => resolve()));
  port = (taken.address() as { port: number }).port;
});
afterAll(async () => {
  await new Promise((resolve) => taken?.close(resolve));
  await nats?.close();
});

const run = (program: string, args: string[]) =>
  spawnSync(process.execPath, [program, "--nats", nats.server.url, "--deployment", "listen-failure", "--token", "t0ken", ...args], { encoding: "utf8", timeout: 20_000, killSignal: "SIGKILL" });

describe("a reference server that cannot listen", () => {
  it.each([
    ["resources-server", "dist/participants/gym/resources-server/main.js", []],
    ["policy-backend", "dist/participants/gym/policy-backend/main.js", []],
    ["attach-model", "dist/participants/attach/main.js", ["--upstream", "http://127.0.0.1:9/v1", "--cuts", "off"]],
  ])("%s: its port in use is one line and exit 1", (name, program, extra) => {
    ensureBuilt();
    const result = run(program, ["--instance", `${name}_busy`, "--port", String(port), ...extra]);
    expect({ status: result.status, stderr: result.stderr.trim() }).toEqual({
      status: 1,
      stderr: `${name}: internal_error: listen EADDRINUSE: address already in use 127.0.0.1:${port}`,
    });
  });
});
