import { describe, expect, it } from "vitest";
import { runSeededWorld, seededRunSettings } from "../../support/seeded-model-run.js";
import { ModelWorld } from "../../support/control-plane-model/model-world.js";

/**
 * Model-based randomised test of the participant control plane: seeded random sequences of control
 * messages (stale and new epochs, old and unknown ids, past deadlines, retries of the same body,
 * malformed bodies), clock advances past leases, data-plane activity and kind-side faults, each
 * answer checked against a reference model of docs/protocol.md and the invariants after every step
 * (see ModelWorld). A failure prints its seed and steps; `MODEL_SEEDS=a-b` runs other seeds.
 */

const { first: FIRST, last: LAST, steps: STEPS } = seededRunSettings("MODEL_SEEDS", "1-200", "MODEL_STEPS", 60);

const runSeed = (seed: number) => runSeededWorld(seed, STEPS, (random) => ModelWorld.create(random));

describe("participant control plane against its protocol model", () => {
  it(`holds every invariant for seeds ${FIRST}-${LAST} × ${STEPS} steps`, async () => {
    for (let seed = FIRST; seed <= LAST; seed++) {
      const failure = await runSeed(seed);
      if (failure) expect.fail(failure);
    }
  }, 120_000);
});
