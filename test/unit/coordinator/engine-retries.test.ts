import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeEngine, writers } from "./fake-participants.js";
import { refusalOf } from "../../support/refusal.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-retries-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const R1 = [{ rollout_id: "r1", attempt: 0 }];

/** A controller retrying an op whose reply it lost gets the same reply; nothing is sent again. */
describe("retrying a controller op that already succeeded", () => {
  it("checkpoint with the same id and arguments returns its reply; other arguments are checkpoint_conflict", async () => {
    const { engine, fake } = makeEngine(root);
    const reply = await engine.checkpoint({ checkpoint_id: "k1", episode_ids: R1, stop: false, controller_state: { inline: 1 } });
    const sent = fake.calls.length;
    expect(await engine.checkpoint({ checkpoint_id: "k1", episode_ids: R1, stop: false, controller_state: { inline: 1 } })).toEqual(reply);
    expect(fake.calls.length).toBe(sent);
    expect((await refusalOf(engine.checkpoint({ checkpoint_id: "k1", episode_ids: null, stop: false, controller_state: { inline: 1 } }))).code).toBe("checkpoint_conflict");
    expect((await refusalOf(engine.checkpoint({ checkpoint_id: "k1", episode_ids: R1, stop: true, controller_state: { inline: 1 } }))).code).toBe("checkpoint_conflict");
    expect(fake.calls.length).toBe(sent);
    // prepare of a used id is still fenced
    expect((await refusalOf(engine.prepare({ checkpoint_id: "k1" }))).code).toBe("stale_checkpoint");
  });

  it("publish with stop returns its reply (the checkpoint closed at once); other state is checkpoint_conflict", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "k2" });
    await engine.commit({ checkpoint_id: "k2", episode_ids: null, stop: true });
    const reply = await engine.publish({ checkpoint_id: "k2", controller_state: { inline: { step: 1 } } });
    expect(engine.openCheckpoint).toBeNull();
    const sent = fake.calls.length;
    expect(await engine.publish({ checkpoint_id: "k2", controller_state: { inline: { step: 1 } } })).toEqual(reply);
    expect((await refusalOf(engine.publish({ checkpoint_id: "k2", controller_state: null }))).code).toBe("checkpoint_conflict");
    expect(fake.calls.length).toBe(sent);
  });

  it("commit and publish after the resume return their replies", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "k3" });
    const committed = await engine.commit({ checkpoint_id: "k3", episode_ids: R1, stop: false });
    const published = await engine.publish({ checkpoint_id: "k3", controller_state: null });
    await engine.resume({ checkpoint_id: "k3" });
    const sent = fake.calls.length;
    expect(await engine.commit({ checkpoint_id: "k3", episode_ids: R1, stop: false })).toEqual(committed);
    expect(await engine.publish({ checkpoint_id: "k3", controller_state: null })).toEqual(published);
    expect((await refusalOf(engine.commit({ checkpoint_id: "k3", episode_ids: null, stop: false }))).code).toBe("checkpoint_conflict");
    expect(fake.calls.length).toBe(sent);
  });

  it("restore with the same id and scope returns the open restore's reply; another scope is still invalid_phase", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    const reply = await engine.restore({ episode_ids: R1 });
    // Only status probes (is the restore still held?) go out: nothing that changes a participant.
    const sent = () => fake.calls.filter((c) => c.op !== "status").length;
    const before = sent();
    expect(await engine.restore({ episode_ids: R1 })).toEqual(reply);
    expect(await engine.restore({ checkpoint_id: "base", episode_ids: R1 })).toEqual(reply);
    expect((await refusalOf(engine.restore({ episode_ids: [{ rollout_id: "r2", attempt: 0 }] }))).code).toBe("invalid_phase");
    expect(sent()).toBe(before);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "base", phase: "restored" });
  });

  it("only the most recent checkpoints keep their replies", async () => {
    const { engine } = makeEngine(root, { retention: 20 });
    for (let i = 0; i < 10; i++) await engine.checkpoint({ checkpoint_id: `n${i}`, episode_ids: null, stop: false, controller_state: null });
    expect((await refusalOf(engine.checkpoint({ checkpoint_id: "n0", episode_ids: null, stop: false, controller_state: null }))).code).toBe("stale_checkpoint");
    expect((await engine.checkpoint({ checkpoint_id: "n9", episode_ids: null, stop: false, controller_state: null })).checkpoint_id).toBe("n9");
  });

  it("after a failover: publish with stop retried at the successor returns the published checkpoint", async () => {
    const first = makeEngine(root);
    await first.engine.prepare({ checkpoint_id: "k4" });
    await first.engine.commit({ checkpoint_id: "k4", episode_ids: null, stop: true });
    const entry = structuredClone(first.journal.entries.get("k4")!);
    const reply = await first.engine.publish({ checkpoint_id: "k4", controller_state: null });
    const second = makeEngine(root);
    await second.journal.record(entry);
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "k4", action: "published_stopped" }]);
    expect(await second.engine.publish({ checkpoint_id: "k4", controller_state: null })).toEqual({ ...reply, deleted: [] });
    expect(await second.engine.commit({ checkpoint_id: "k4", episode_ids: null, stop: true })).toMatchObject({ checkpoint_id: "k4", participants: expect.any(Array) });
  });
});
