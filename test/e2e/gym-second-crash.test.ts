import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TASK, startGymWorld, type GymWorld } from "../support/gym-processes.js";
import { ep } from "../support/episode.js";

/**
 * A second crash before the replacement starts: the restored state is exported again by the next
 * checkpoint as attempt 1 and restored as attempt 2. Generation cuts are on: a restored cut not
 * yet consumed travels with it (exported under attempt 1, still naming the attempt that was cut).
 */
let world: GymWorld;

beforeAll(async () => {
  world = await startGymWorld();
}, 60_000);
afterAll(async () => {
  await world?.close();
});

async function callsOf(rollout: string): Promise<[string | null, number][]> {
  return (await world.backend.calls())
    .filter((c) => c.capture_key === rollout || c.capture_key?.startsWith(`${rollout}-a`))
    .map((c) => [c.capture_key, c.message_count]);
}

async function startHeld(rollouts: string[], total: number) {
  const runs = rollouts.map((r) => world.run(r, 0, TASK).catch((error: unknown) => ({ status: 0, body: { lost: String(error) } })));
  await world.waitFor(async () => (await world.backend.calls()).length >= total, `${total} backend calls`);
  return runs;
}

describe("reference Gym: a second crash", () => {
  it("a second crash before the replacement starts still continues (restored state re-exported as attempt 1, restored as attempt 2)", async () => {
    await world.backend.hold(1);
    const [lost] = await startHeld(["second-1"], 2);
    await world.checkpointNoResume("cp-second-1", [ep("second-1")]);
    await world.crashAndRestart("cp-second-1");
    await world.backend.release();
    await lost;
    await world.restoreAndResume("cp-second-1", [ep("second-1")]);
    expect((await world.status("environment")).extras).toMatchObject({ restored_pending: 1 });
    // A checkpoint before the replacement was dispatched, then a second crash.
    await world.checkpointNoResume("cp-second-2", [ep("second-1", 1)]);
    await world.crashAndRestart("cp-second-2");
    await world.restoreAndResume("cp-second-2", [ep("second-1", 1)]);
    expect((await world.run("second-1", 1)).body.error.code).toBe("stale_attempt");
    const replacement = await world.run("second-1", 2);
    expect(replacement.body).toMatchObject({ attempt: 2, reward: 1, continued_from: "invoke_agent" });
    expect(await callsOf("second-1")).toEqual([
      ["second-1", 2],
      ["second-1", 4],
      ["second-1-a2", 4],
    ]);
    await world.client.forget({ rollout_ids: ["second-1"] });
  });
});
