import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeEngine, writers } from "../coordinator/fake-participants.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-engine-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const R1 = [{ rollout_id: "r1", attempt: 0 }];

/**
 * docs/api.md: "a refused request changes nothing". A restore's reply is lost; by the time the
 * controller retries it (same arguments, so its deadline_ts is past), the restored processes no longer
 * hold it (lease expired / restarted). restore() skipped the deadline check because the request looked
 * like a retry of the open restore, then closeIfNobodyHolds closed that restore, and the request went on
 * as a fresh restore: journaled `restoring`, opened, and only then refused deadline_exceeded.
 */
describe("restore retried with a past deadline after its restore was released", () => {
  it("is refused without journaling or opening a new restore", async () => {
    const { engine, clock, fake, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    await waitEmpty(journal);
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.restore({ checkpoint_id: "base", deadline_ts, episode_ids: R1 });
    // the reply was lost; meanwhile every participant let the restore go (lease expired)
    for (const key of [...fake.state.keys()]) fake.state.set(key, { phase: "idle", checkpoint_id: null });
    clock.current += 70_000;
    const restoresBefore = fake.ops("restore").length;
    const retry = engine.restore({ checkpoint_id: "base", deadline_ts, episode_ids: R1 });
    await expect(retry).rejects.toMatchObject({ code: expect.stringMatching(/deadline_exceeded|restore_failed/) });
    // a refusal changes nothing: no restore left open, no `restoring` entry a successor would re-drive
    expect({ open: engine.openCheckpoint, journal: [...journal.entries.values()].map((e) => `${e.checkpoint_id}:${e.state}`) }).toEqual({ open: null, journal: [] });
    expect([...journal.entries.values()].map((e) => e.state)).not.toContain("restoring");
    expect(fake.ops("restore").length).toBe(restoresBefore);
    // and the next checkpoint is not blocked by a restore nobody drives
    await expect(engine.prepare({ checkpoint_id: "next", deadline_ts: clock.now() / 1000 + 60 })).resolves.toMatchObject({ prepared: true });
  });
});

async function waitEmpty(journal: { entries: Map<string, unknown> }): Promise<void> {
  for (let i = 0; i < 200 && journal.entries.size > 0; i++) await new Promise((r) => setTimeout(r, 10));
}
