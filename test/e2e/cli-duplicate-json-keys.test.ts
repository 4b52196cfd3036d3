import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { cli, ensureBuilt } from "./coordinator-process.js";

/**
 * docs/api.md: a request that names a key twice in one object (an inline controller state
 * included) is invalid_request over NATS and HTTP alike, since JSON.parse would silently keep the
 * last. The CLI's own JSON inputs (`--state-json`, `--episodes @file`) are refused the same way,
 * exit 2 before anything is connected, rather than collapsed and sent as a request the coordinator
 * then accepts. No nats-server: the address given refuses connections.
 */
let dir: string;
beforeAll(async () => {
  ensureBuilt();
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-dupkeys-"));
});
afterAll(async () => {
  await rm(dir, { recursive: true, force: true });
});

const offline = ["--token", "t", "--nats-url", "nats://127.0.0.1:1", "--leader-wait-ms", "0"];

describe("gym-ckpt CLI JSON inputs naming a key twice (built binary)", () => {
  it("--state-json with a key twice is invalid_request (exit 2), not sent with the last value", async () => {
    for (const args of [
      ["checkpoint", "--id", "dup-1", "--state-json", '{"step":1,"step":2}'],
      ["publish", "dup-1", "--state-json", '{"trainer":{"lr":1,"lr":2}}'],
    ]) {
      const run = await cli([...args, ...offline]);
      expect([args[0], run.code, run.stderr]).toEqual([args[0], 2, expect.stringMatching(/^error invalid_request: --state-json names key "(step|lr)" twice in one object/)]);
    }
  });

  it("an --episodes @file with a key twice in an entry is invalid_request (exit 2)", async () => {
    const file = join(dir, "episodes.json");
    await writeFile(file, '[{"rollout_id":"a","attempt":0,"attempt":1}]');
    const run = await cli(["restore", "--episodes", `@${file}`, ...offline]);
    expect([run.code, run.stderr]).toEqual([2, expect.stringMatching(/^error invalid_request: episodes file .*episodes\.json names key "attempt" twice in one object/)]);
  });
});
