import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeEngine, writers } from "./fake-participants.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-review-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const R1 = [{ rollout_id: "r1", attempt: 0 }];

/**
 * docs/api.md "Retrying a controller op": a controller whose reply was lost (a reply timeout, which
 * the clients declare at deadline_ts + slack) retries with the same id and arguments and gets the
 * op's reply; "prepare, commit and publish answer from the open checkpoint", "a restore retried
 * while it is open (same id ... and the same episode_ids) returns its reply".
 * The same arguments include the same deadline_ts, which is in the past by then.
 */
describe("retry with the same arguments after a reply timeout (deadline_ts now past)", () => {
  it("commit of the open checkpoint answers its reply", async () => {
    const { engine, clock } = makeEngine(root);
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.prepare({ checkpoint_id: "rt1", deadline_ts });
    const committed = await engine.commit({ checkpoint_id: "rt1", deadline_ts, episode_ids: R1, stop: false });
    // the reply was lost; the client gives up at deadline_ts + slack (10 s) and retries the same request
    clock.current += 70_000;
    await expect(engine.commit({ checkpoint_id: "rt1", deadline_ts, episode_ids: R1, stop: false })).resolves.toEqual(committed);
  });

  it("resume of a checkpoint it closed answers again; a fresh op with a past deadline is still refused, nothing sent", async () => {
    const { engine, clock, fake } = makeEngine(root);
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.prepare({ checkpoint_id: "rt2", deadline_ts });
    const resumed = await engine.resume({ checkpoint_id: "rt2", deadline_ts });
    clock.current += 70_000;
    const sent = fake.calls.length;
    await expect(engine.resume({ checkpoint_id: "rt2", deadline_ts })).resolves.toEqual({ checkpoint_id: "rt2", participants: [] });
    await expect(engine.prepare({ checkpoint_id: "rt3", deadline_ts })).rejects.toMatchObject({ code: "deadline_exceeded" });
    expect(fake.calls.length).toBe(sent);
    expect(resumed.participants.length).toBeGreaterThan(0);
  });

  it("restore of the open restore answers its reply", async () => {
    const { engine, clock } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    const deadline_ts = clock.now() / 1000 + 60;
    const restored = await engine.restore({ checkpoint_id: "base", deadline_ts, episode_ids: R1 });
    clock.current += 70_000;
    await expect(engine.restore({ checkpoint_id: "base", deadline_ts, episode_ids: R1 })).resolves.toEqual(restored);
  });
});
