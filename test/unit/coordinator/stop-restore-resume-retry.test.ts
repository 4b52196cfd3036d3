import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { journalEmptied, makeEngine, writers } from "../coordinator/fake-participants.js";

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
 * docs/api.md resume: "Resuming an id that is already closed is idempotent, also when the retry's
 * deadline_ts has passed". The usual restart path: the controller stops with a `stop` checkpoint,
 * a new controller restores it (LATEST) into fresh Gym servers and resumes it; that resume's reply
 * is lost and the retry (same arguments, a past deadline_ts) must get the same success. Because the id
 * is still in `stopped`, the retry skips the closed fast path and is refused deadline_exceeded.
 */
describe("resume retried after the restore of a stop checkpoint was resumed", () => {
  it("answers success although its deadline_ts has passed", async () => {
    const { engine, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "stop-1", episode_ids: null, stop: true, controller_state: null });
    await journalEmptied(journal);
    // a new controller, fresh processes (status idle): restore LATEST, then resume it
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.restore({ checkpoint_id: "stop-1", deadline_ts, episode_ids: R1 });
    await engine.resume({ checkpoint_id: "stop-1", deadline_ts });
    // the resume's reply was lost; the client retries the same request after its reply timeout
    clock.current += 70_000;
    await expect(engine.resume({ checkpoint_id: "stop-1", deadline_ts })).resolves.toMatchObject({ checkpoint_id: "stop-1" });
  });

  it("the resume that released a stop checkpoint's parked participants, retried after its deadline, answers success", async () => {
    const { engine, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "stop-2", episode_ids: null, stop: true, controller_state: null });
    await journalEmptied(journal);
    const deadline_ts = clock.now() / 1000 + 60;
    const released = await engine.resume({ checkpoint_id: "stop-2", deadline_ts });
    expect(released.participants.length).toBe(5);
    clock.current += 70_000;
    await expect(engine.resume({ checkpoint_id: "stop-2", deadline_ts })).resolves.toMatchObject({ checkpoint_id: "stop-2" });
  });

  it("control: the same sequence with a non-stop checkpoint answers success", async () => {
    const { engine, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "go-1", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.restore({ checkpoint_id: "go-1", deadline_ts, episode_ids: R1 });
    await engine.resume({ checkpoint_id: "go-1", deadline_ts });
    clock.current += 70_000;
    await expect(engine.resume({ checkpoint_id: "go-1", deadline_ts })).resolves.toMatchObject({ checkpoint_id: "go-1" });
  });
});
