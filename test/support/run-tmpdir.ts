import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";

/**
 * Vitest global setup: one temporary directory per test run, the TMPDIR of every test process and
 * of the programs they start. What lands under the system temp directory by default (a model
 * proxy's capture ledger, the files of a process a test SIGKILLed) goes with the run.
 */
export default async function setup(): Promise<() => Promise<void>> {
  const dir = await mkdtemp(join(tmpdir(), "gym-ckpt-tests-"));
  const previous = process.env.TMPDIR;
  process.env.TMPDIR = dir;
  return async () => {
    if (previous === undefined) delete process.env.TMPDIR;
    else process.env.TMPDIR = previous;
    await rm(dir, { recursive: true, force: true });
  };
}
