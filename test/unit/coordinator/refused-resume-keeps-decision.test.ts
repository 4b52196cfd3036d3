import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeEngine, writers } from "./fake-participants.js";
import { refusalOf } from "../../support/refusal.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-refused-resume-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const R1 = [{ rollout_id: "r1", attempt: 0 }];

/**
 * A refused request changes nothing (docs/api.md): a `resume` of a decided checkpoint whose
 * deadline_ts is refused (milliseconds sent as seconds, or already past) must leave the commit
 * decision journaled. Withdrawn, a successor would presume abort: resume a checkpoint the
 * controller then publishes, or abandon one it was about to publish.
 */
describe("a refused resume of a committed checkpoint", () => {
  it.each([
    ["milliseconds sent as seconds (invalid_request)", () => Date.now(), "invalid_request"],
    ["a deadline already past (deadline_exceeded)", () => 1, "deadline_exceeded"],
  ])("%s leaves the decision journaled and sends nothing", async (_label, deadline, code) => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "d1" });
    await engine.commit({ checkpoint_id: "d1", episode_ids: R1, stop: false });
    expect(journal.entries.get("d1")?.state).toBe("decided");
    const sent = fake.calls.length;
    const events = fake.events.length;
    expect((await refusalOf(engine.resume({ checkpoint_id: "d1", deadline_ts: deadline() }))).code).toBe(code);
    expect(journal.entries.get("d1")?.state).toBe("decided");
    expect(fake.events.slice(events)).toEqual([]);
    expect(fake.calls.length).toBe(sent);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "d1", phase: "committed" });
  });
});
