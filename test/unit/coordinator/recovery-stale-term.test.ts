import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointError } from "../../../protocol/index.js";
import { makeEngine, writers } from "./fake-participants.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-stale-term-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/**
 * A recover() called in one leadership term (the daemon's onReady) may start, or still wait for the
 * engine's lock, when that term ends and the lease is won again (a new term, a new epoch, whose
 * onReady calls recover() once more). It must not act in the new term: that term's own recovery
 * does, and would otherwise take what the stale one left open for a leftover and close it.
 */
describe("a recovery whose leadership term ended before it ran", () => {
  it("does nothing in the next term (running or queued); that term's recovery keeps a published checkpoint open and journaled", async () => {
    // A predecessor published x1 and died before resuming it; the participants still hold it.
    const first = makeEngine(root);
    await first.engine.prepare({ checkpoint_id: "x1" });
    await first.engine.commit({ checkpoint_id: "x1", episode_ids: null, stop: false });
    const entry = structuredClone(first.journal.entries.get("x1")!);
    await first.engine.publish({ checkpoint_id: "x1", controller_state: null });
    await first.writer.settled();

    const { engine, fake, journal, leadership, writer } = makeEngine(root, { requireRecovery: true });
    await journal.record({ ...entry, auto_publish: false });
    for (const m of fake.members) fake.state.set(`${m.kind}.${m.instance}`, { phase: "committed", checkpoint_id: "x1" });
    fake.events.length = 0;
    journal.log.length = 0;
    // This coordinator's lease: epoch 7 now; lost and won again below (epoch 9).
    let epoch: number | null = 7;
    leadership.epoch = () => {
      if (epoch === null) throw new CheckpointError("not_leader", "not leading");
      return epoch;
    };
    leadership.assert = (e) => {
      if (leadership.epoch() !== e) throw new CheckpointError("not_leader", `epoch ${e} is no longer this coordinator's`);
    };
    leadership.state = () => ({ id: "c", leader: epoch !== null, ready: epoch !== null, epoch });

    // Term 7's recovery stalls listing the journal (a slow KV listing), holding the engine's lock;
    // a second recover() of term 7 (a daemon retry) queues behind it.
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const list = journal.list.bind(journal);
    journal.list = async () => {
      journal.list = list;
      await gate;
      return list();
    };
    const running = engine.recover().then(
      (done) => ({ done }),
      (error: unknown) => ({ error }),
    );
    const queued = engine.recover().then(
      (done) => ({ done }),
      (error: unknown) => ({ error }),
    );
    // Term 7 ends; the lease is won again (epoch 9), whose onReady calls recover().
    epoch = null;
    engine.leadershipLost();
    epoch = 9;
    const current = engine.recover();
    release();

    const stale = [await running, await queued];
    // Term 9's recovery finds x1 as its predecessor left it and keeps it open for the controller's
    // resume (not closed as a leftover of an earlier recovery, its journal entry removed).
    expect(await current).toEqual([{ checkpoint_id: "x1", action: "published_open" }]);
    expect(engine.recovered).toBe(true);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "x1", phase: "published", epoch: 9 });
    expect(fake.ops("status")).toHaveLength(5); // one probe, term 9's
    expect(fake.ops("status").every((c) => c.body.epoch === 9)).toBe(true);
    await writer.durable();
    await new Promise((resolve) => setImmediate(resolve)); // a removal scheduled by a close would have run by now
    expect(journal.log.filter((l) => l.op === "remove")).toEqual([]);
    expect(journal.entries.has("x1")).toBe(true);
    // Neither stale recovery acted in term 9 (the probe above is term 9's own): each stopped, having done nothing.
    expect(stale).toEqual([{ done: [] }, { done: [] }]);

    // The controller's resume closes it: everyone resumed, the entry removed.
    expect((await engine.resume({ checkpoint_id: "x1" })).participants).toHaveLength(5);
    expect(engine.openCheckpoint).toBeNull();
  });
});
