import { fileURLToPath } from "node:url";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { closedPort } from "../support/ports.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * `--episode-timeout-ms 0` of the environment server (and of the agent's legacy /run) is no deadline,
 * as a 0 lifetime or wait is elsewhere in gym-ckpt. It was taken as a 0 ms deadline: the server
 * started, and every /run answered deadline_exceeded before its first call.
 */
const main = (server: string) => fileURLToPath(new URL(`../../dist/participants/gym/${server}/main.js`, import.meta.url));
let nats: NatsFixture;
const programs: ChildProgram[] = [];
beforeAll(async () => {
  ensureBuilt();
  nats = await startNats();
});
afterAll(async () => {
  await Promise.all(programs.map((p) => p.kill("SIGKILL")));
  await nats?.close();
});

describe("--episode-timeout-ms 0", () => {
  it.each([
    ["environment-server", "--agent-url"],
    ["agent-server", "--policy-url"],
  ])("%s: /run runs without a deadline (its callees' failure, not deadline_exceeded)", async (server, urlFlag) => {
    // Nothing listens behind the callee URLs: a /run that starts fails on its first call.
    const callee = `http://127.0.0.1:${await closedPort()}`;
    const program = await startChildProgram(
      main(server),
      ["--nats", nats.server.url, "--token", "t0ken", "--deployment", `zero${process.pid}`, urlFlag, callee, "--resources-url", callee, "--episode-timeout-ms", "0"],
      { waitReady: true, readyTimeoutMs: 20_000 },
    );
    programs.push(program);
    const response = await fetch(`${String(program.ready!.url)}/run`, {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ rollout_id: "r1", attempt: 0, task: { expression: "1+1", tool_rounds: 1 } }),
    });
    expect({ status: response.status, code: ((await response.json()) as { error?: { code?: string } }).error?.code }).toEqual({ status: 502, code: "upstream_failed" });
  }, 40_000);
});
