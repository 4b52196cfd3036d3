import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { collectorIn, idleController } from "../../support/collector-fixture.js";
import { passFakeTime as pass } from "../../support/fake-time.js";
import { startHeldCallee, type HeldCallee } from "../../support/held-callee.js";

/**
 * A `/run` may last longer than 300 s of wall-clock time: the collector's run timeout stands still
 * while a checkpoint parks the episode, and `--run-timeout-seconds` may be longer. Node's fetch
 * gives up after 300 s without response headers (undici's headersTimeout), which would count such
 * a row as failed.
 */

let server: HeldCallee | undefined;
let dir: string;

// One fake clock for the whole file: fetch's timers (module state in Node's undici, created at its
// first call) run on it, so 300 s pass without waiting for them.
beforeAll(async () => {
  vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout", "setInterval", "clearInterval", "Date", "performance"] });
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collector-long-"));
});
afterAll(async () => {
  vi.useRealTimers();
  await server?.close();
  await rm(dir, { recursive: true, force: true });
});

describe("collector /run calls", () => {
  it("a /run answered after more than 300 s (within the run timeout) finishes its row", async () => {
    server = await startHeldCallee();
    const collector = collectorIn(dir, `${server.url}/run`, idleController(), { runTimeoutSeconds: 3600, maxAttempts: 1 });
    await collector.start();
    const run = collector.run();
    const res = await server.arrived();
    await pass(310_000);
    res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ rollout_id: "a", attempt: 0, reward: 1 }));
    expect(await run).toMatchObject({ finished: 1, failed: 0 });
  });
});
