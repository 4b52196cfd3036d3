import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { runSeededWorld, seededRunSettings, failingSeeds } from "../../support/seeded-model-run.js";
import { CollectorWorld } from "./collector-model-world.js";

/**
 * Model-based randomised test of the rollout collector: seeded random sequences of /run answers
 * (success, slow, 5xx, reset, oversized, malformed, none), checkpoints (explicit and on a timer)
 * failing at each op or killed mid-op, restores succeeding, failing or losing their reply, crashes
 * and SIGTERM stops with a new Collector on the same files (--out's or dispatched.jsonl's last
 * line torn, an attempt logged and never sent, the restored lines cut short, a durable replace cut
 * off), Gym restarts, /run down, retires and forgets failing, a --new-collection abandoning the
 * collection; some worlds write rollout records (--records-dir); after every step the invariants
 * docs/collect.md promises (see CollectorWorld).
 * A failure prints its seed and steps (timing-dependent: the /run server and the run timeout are
 * real, so a seed may need a few runs to fail again); `COLLECTOR_MODEL_SEEDS=a-b` runs other
 * seeds, `COLLECTOR_MODEL_STEPS` longer sequences.
 */

const { first: FIRST, last: LAST, steps: STEPS } = seededRunSettings("COLLECTOR_MODEL_SEEDS", "1-8", "COLLECTOR_MODEL_STEPS", 30);

async function runSeed(seed: number): Promise<string | undefined> {
  const root = await mkdtemp(join(tmpdir(), `gym-ckpt-collector-model-${seed}-`));
  try {
    return await runSeededWorld(seed, STEPS, async (random) => {
      const world = new CollectorWorld(random, root, STEPS);
      await world.init();
      return world;
    });
  } finally {
    await rm(root, { recursive: true, force: true, maxRetries: 5 });
  }
}

describe("collector against the invariants of docs/collect.md", () => {
  it(`holds every invariant for seeds ${FIRST}-${LAST} × ${STEPS} steps`, async () => {
    const failures = await failingSeeds(FIRST, LAST, runSeed);
    if (failures) expect.fail(failures);
  }, Math.max(120_000, (LAST - FIRST + 1) * STEPS * 100));
});
