import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { runSeededWorld, seededRunSettings, failingSeeds } from "../../support/seeded-model-run.js";
import { EngineWorld } from "./engine-model-world.js";
import { writers } from "./fake-participants.js";

/**
 * Model-based randomised test of the coordinator engine: seeded random sequences of controller ops
 * (fresh, reused and open ids, retries of the previous request after a lost reply, past deadlines),
 * participant faults toggled between them (unreachable, timing out, answering only after the try's
 * timeout, refusing, every restore refused), leases expiring at a participant, participants
 * restarting (a new incarnation holding nothing; the coordinator's view showing it at once or
 * later), rollouts reaching processes (live state: no longer fresh), a job restarted in whole or in
 * part restoring LATEST, leadership lost and regained or taken by a successor. Each process
 * remembers what a real one does (ParticipantMemory: the ids it resumed, its kept commit replies,
 * its live state, its retired and restored-from attempt marks) and refuses as it would: retire and
 * forget only while idle or restored (naming that id), and every phase message but resume past its
 * deadline, which a participant may also meet mid-op (its message arriving only then, or its kind's
 * hook outliving it: the test's clock moves there). After every step the
 * invariants docs/api.md and docs/protocol.md promise (see EngineWorld). A failure prints its seed and steps;
 * `ENGINE_MODEL_SEEDS=a-b` runs other seeds, `ENGINE_MODEL_STEPS` longer sequences.
 */

const { first: FIRST, last: LAST, steps: STEPS } = seededRunSettings("ENGINE_MODEL_SEEDS", "1-100", "ENGINE_MODEL_STEPS", 40);

async function runSeed(seed: number): Promise<string | undefined> {
  const root = await mkdtemp(join(tmpdir(), `gym-ckpt-engine-model-${seed}-`));
  try {
    return await runSeededWorld(seed, STEPS, async (random) => new EngineWorld(random, root));
  } finally {
    await Promise.all(writers.splice(0).map((w) => w.settled()));
    await rm(root, { recursive: true, force: true });
  }
}

describe("coordinator engine against the invariants of docs/api.md", () => {
  it(`holds every invariant for seeds ${FIRST}-${LAST} × ${STEPS} steps`, async () => {
    const failures = await failingSeeds(FIRST, LAST, runSeed);
    if (failures) expect.fail(failures);
  }, Math.max(120_000, (LAST - FIRST + 1) * STEPS * 10));
});
