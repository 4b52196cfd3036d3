import { afterAll, describe, expect, it } from "vitest";
import { launchGym, type Gym } from "../../participants/gym/gym-launcher.js";
import { NatsServerProcess } from "../support/nats.js";
import { freePortRun } from "../support/ports.js";
import { waitUntil } from "../support/wait-until.js";
import { ensureBuilt } from "./coordinator-process.js";

/**
 * docs/gym.md: GYM_CKPT_NATS_CONNECT_WAIT_MS is how long each server of `gym-ckpt gym` waits for a
 * NATS server that does not accept connections yet. The launcher gave every server 20 s for its
 * ready line whatever that wait was, so a Gym started up to a minute before its NATS
 * (GYM_CKPT_NATS_CONNECT_WAIT_MS=60000) failed after 20 s: "policy did not print its ready line in time".
 */
let server: NatsServerProcess | undefined;
let gym: Gym | undefined;
afterAll(async () => {
  await gym?.stop();
  await server?.dispose();
});

const WAITING = "NATS is not reachable yet";

describe("gym launcher started before its NATS server", () => {
  it("waits for the ready lines as long as GYM_CKPT_NATS_CONNECT_WAIT_MS lets the servers wait for NATS", async () => {
    ensureBuilt();
    const port = await freePortRun(1);
    const waiting = new Set<string>();
    const started = Date.now();
    const launching = launchGym({
      nats: `nats://127.0.0.1:${port}`,
      deployment: `late${process.pid}`,
      token: "t0ken",
      env: { GYM_CKPT_NATS_CONNECT_WAIT_MS: "60000" },
      onOutput: (name, line) => void (line.includes(WAITING) && waiting.add(name)),
    });
    const outcome = launching.then(
      () => "ready",
      (error: unknown) => `failed: ${error instanceof Error ? error.message.split("\n")[0] : String(error)}`,
    );
    await waitUntil(() => waiting.has("policy") && waiting.has("resources"), "the first servers to say they wait for NATS", 20_000);
    // NATS comes up later than the launcher's own 20 s default for a ready line.
    let early: string | undefined;
    void outcome.then((o) => (early = o));
    await waitUntil(() => Date.now() - started > 22_000 || early !== undefined, "22 s to pass", 30_000);
    expect(early).toBeUndefined();
    server = await NatsServerProcess.start({ port });
    expect(await outcome).toBe("ready");
    gym = await launching;
    expect([...gym.processes.keys()].sort()).toEqual(["agent", "environment", "model", "policy", "resources"]);
  }, 90_000);
});
