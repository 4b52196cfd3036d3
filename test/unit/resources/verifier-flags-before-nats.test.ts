import { spawnSync } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it } from "vitest";

const MAIN = fileURLToPath(new URL("../../../participants/verifiers/main.ts", import.meta.url));

/**
 * A verifier flag no restart can fix exits 2 also while NATS is down: exit 1 (unreachable) would
 * have a supervisor restart it for ever. Port 1 on 127.0.0.1 refuses every connection.
 */
function start(flags: string[]) {
  // SIGKILLed at the timeout, so none outlives the test: spawnSync's default (SIGTERM) let one that
  // handles it run on, and spawnSync, waiting for its exit, blocked the worker past the test's timeout.
  return spawnSync(process.execPath, ["--import", "tsx", MAIN, ...flags, "--nats", "nats://127.0.0.1:1", "--token", "t"], { encoding: "utf8", timeout: 30_000, killSignal: "SIGKILL", env: { ...process.env, OTEL_SDK_DISABLED: "true" } });
}

describe("verifier flags refused before NATS", () => {
  const judge = ["--judge-url", "http://127.0.0.1:9"];
  for (const flags of [
    ["--verifier", "equivalence", ...judge, "--judge-timeout-ms", "0"],
    ["--verifier", "cohort", ...judge, "--collection-timeout-ms", "0"],
    ["--verifier", "cohort", ...judge, "--evaluation-timeout-ms", "0"],
  ]) {
    it(`${flags.slice(-2).join(" ")} exits 2 with NATS unreachable`, { timeout: 40_000 }, () => {
      const run = start(flags);
      expect({ status: run.status, stderr: run.stderr.trim() }).toEqual({ status: 2, stderr: expect.stringMatching(/^verifier: .*must be/) });
    });
  }
});
