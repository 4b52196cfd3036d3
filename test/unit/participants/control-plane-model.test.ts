import { describe, expect, it } from "vitest";
import { mulberry32 } from "../../support/seeded-random.js";
import { InvariantViolation, ModelWorld } from "../../support/control-plane-model/model-world.js";

/**
 * Model-based randomised test of the participant control plane: seeded random sequences of control
 * messages (stale and new epochs, old and unknown ids, past deadlines, retries of the same body,
 * malformed bodies), clock advances past leases, data-plane activity and kind-side faults, each
 * answer checked against a reference model of docs/protocol.md and the invariants after every step
 * (see ModelWorld). A failure prints its seed and steps; `MODEL_SEEDS=a-b` runs other seeds.
 */

const [FIRST, LAST] = (process.env["MODEL_SEEDS"] ?? "1-200").split("-").map(Number) as [number, number];
const STEPS = Number(process.env["MODEL_STEPS"] ?? 60);

async function runSeed(seed: number): Promise<string | undefined> {
  const world = await ModelWorld.create(mulberry32(seed));
  try {
    for (let i = 0; i < STEPS; i++) await world.step();
    return undefined;
  } catch (error) {
    if (!(error instanceof InvariantViolation)) throw error;
    return `seed ${seed}: ${error.message}\nsteps:\n${world.steps.map((s, i) => `  ${i}: ${s}`).join("\n")}`;
  } finally {
    await world.close();
  }
}

describe("participant control plane against its protocol model", () => {
  it(`holds every invariant for seeds ${FIRST}-${LAST} × ${STEPS} steps`, async () => {
    for (let seed = FIRST; seed <= LAST; seed++) {
      const failure = await runSeed(seed);
      if (failure) expect.fail(failure);
    }
  }, 120_000);
});
