import { mulberry32 } from "./seeded-random.js";

/** What a model world's step throws when an invariant fails: the run reports it with its seed and steps. */
export class InvariantViolation extends Error {}

/** A model-based test's world: random steps from its seed, each checked, and the steps taken so far. */
export interface ModelRunWorld {
  readonly steps: readonly string[];
  step(): Promise<void>;
  close(): Promise<void>;
}

/**
 * The seeds (`a-b`, or the one seed `a` a failure names, from the environment variable `env`, else
 * `fallback`) and steps (`stepsEnv`, else `steps`) to run. Anything else throws: a value that
 * parsed to no seed or no step ran nothing, and the test passed.
 */
export function seededRunSettings(env: string, fallback: string, stepsEnv: string, steps: number): { first: number; last: number; steps: number } {
  const seeds = process.env[env] ?? fallback;
  const range = /^(\d+)(?:-(\d+))?$/.exec(seeds);
  const first = Number(range?.[1]);
  const last = Number(range?.[2] ?? range?.[1]);
  if (!range || last < first) throw new Error(`${env}=${seeds}: expected a seed or a range a-b (a <= b)`);
  const stepsText = process.env[stepsEnv] ?? String(steps);
  if (!/^[1-9]\d*$/.test(stepsText)) throw new Error(`${stepsEnv}=${stepsText}: expected a positive whole number of steps`);
  return { first, last, steps: Number(stepsText) };
}

/**
 * Runs `steps` steps of the world `make` builds for `seed` (closed after, whatever happened):
 * undefined when every invariant held, else the seed, the violation and every step that led to
 * it, so the failure reproduces. Anything but an InvariantViolation is thrown as it is.
 */
export async function runSeededWorld(seed: number, steps: number, make: (random: () => number) => Promise<ModelRunWorld>): Promise<string | undefined> {
  const world = await make(mulberry32(seed));
  try {
    for (let i = 0; i < steps; i++) await world.step();
    return undefined;
  } catch (error) {
    if (!(error instanceof InvariantViolation)) throw error;
    return `seed ${seed}: ${error.message}\nsteps:\n${world.steps.map((s, i) => `  ${i}: ${s}`).join("\n")}`;
  } finally {
    await world.close();
  }
}

/** Runs seeds `first`..`last` with `runSeed`, stopping at the third failing one: their reports, joined (empty when all held). */
export async function failingSeeds(first: number, last: number, runSeed: (seed: number) => Promise<string | undefined>): Promise<string> {
  const failures: string[] = [];
  for (let seed = first; seed <= last && failures.length < 3; seed++) {
    const failure = await runSeed(seed);
    if (failure) failures.push(failure);
  }
  return failures.join("\n\n");
}
