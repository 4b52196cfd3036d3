import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { FOUR_KINDS, journalEntry, makeEngine, writers } from "./fake-participants.js";

/**
 * Recovery closes an unpublished decided entry that has a newer entry after it (its leader closed
 * it before the newer one opened). "Newer" was `epoch`, then `prepared_at`: a wall clock stepped
 * back, or a successor's rewrite of an older entry under its own epoch, put a newer decision first,
 * and recovery closed it as superseded (its participants parked until their lease grace, the
 * controller's retry refused). The order is now the one the checkpoints opened in.
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-recovery-order-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("recovery orders journal entries as their checkpoints opened", () => {
  it("a wall clock stepped back after an older entry's removal stalled: the newer decision is completed, the older closed", async () => {
    // x's entry outlives its close (its removal never finishes).
    const a = makeEngine(root, { hooks: { beforeJournalRemove: (id) => (id === "x" ? new Promise<void>(() => undefined) : undefined) } });
    await a.engine.checkpoint({ checkpoint_id: "x", episode_ids: null, stop: false, controller_state: null });
    // An NTP step puts the wall clock an hour back; y opens and is decided, and its leader dies before publishing.
    a.clock.current -= 3_600_000;
    await a.engine.prepare({ checkpoint_id: "y" });
    await a.engine.commit({ checkpoint_id: "y", episode_ids: null, stop: false });
    expect([...a.journal.entries.keys()].sort()).toEqual(["x", "y"]);
    expect(a.journal.entries.get("y")!.prepared_at).toBeLessThan(a.journal.entries.get("x")!.prepared_at);

    const successor = makeEngine(root, { successorOf: { fake: a.fake, journal: a.journal, clock: a.clock }, epoch: 8 });
    const recovered = await successor.engine.recover();
    expect(recovered.find((r) => r.checkpoint_id === "y")?.action).toBe("committed");
    expect(recovered.find((r) => r.checkpoint_id === "x")?.action).not.toBe("committed");
  });

  it.each([
    { written: "with their opened order", order: (seq: number) => ({ opened_epoch: 10, opened_seq: seq }) },
    { written: "by an older version (no opened order)", order: () => ({}) },
  ])("a successor's rewrite of an older entry under its own epoch does not make it newer than a decision of the epoch before (entries $written)", async ({ order }) => {
    const participants = FOUR_KINDS.map((m) => ({ ...m }));
    const b = makeEngine(root, { epoch: 20 });
    // Left by a leader of epoch 10: x's resume (its removal failed) and then y's decision.
    const x = journalEntry({ checkpoint_id: "x", state: "resuming", participants, epoch: 10, prepared_at: 1, updated_at: 1, ...order(1) });
    const y = journalEntry({ checkpoint_id: "y", state: "decided", participants, epoch: 10, prepared_at: 2, updated_at: 2, ...order(2) });
    await b.journal.record(x);
    await b.journal.record(y);
    // b rewrites x under epoch 20, then loses its lease before it reaches y.
    const record = b.journal.record.bind(b.journal);
    b.journal.record = async (entry) => {
      await record(entry);
      if (entry.checkpoint_id === "x" && entry.state === "resuming") {
        b.leadership.demote();
        b.engine.leadershipLost();
      }
    };
    await b.engine.recover();
    expect(b.journal.entries.get("x")).toMatchObject({ state: "resuming", epoch: 20 });
    expect(b.journal.entries.get("y")).toMatchObject({ state: "decided", epoch: 10 });

    const c = makeEngine(root, { successorOf: { fake: b.fake, journal: b.journal, clock: b.clock }, epoch: 30 });
    const recovered = await c.engine.recover();
    expect(recovered.find((r) => r.checkpoint_id === "y")?.action).toBe("committed_published_resumed");
    expect(await c.catalog.latest()).toBe("y");
  });

  it("entries of an older version (no opened order) keep the old order: epoch, then prepared_at", async () => {
    const participants = FOUR_KINDS.map((m) => ({ ...m }));
    const { engine, journal } = makeEngine(root);
    await journal.record(journalEntry({ checkpoint_id: "older", state: "decided", participants, epoch: 3, prepared_at: 5, updated_at: 5 }));
    await journal.record(journalEntry({ checkpoint_id: "newer", state: "decided", participants, epoch: 4, prepared_at: 2, updated_at: 2 }));
    const recovered = await engine.recover();
    expect(recovered).toEqual([
      { checkpoint_id: "older", action: "superseded_closed" },
      { checkpoint_id: "newer", action: "committed_published_resumed" },
    ]);
  });

  it("a rewrite of an older version's entry keeps its epoch as the opening one (a successor's epoch would make it newer), with no opened_seq", async () => {
    const participants = FOUR_KINDS.map((m) => ({ ...m }));
    const b = makeEngine(root, { epoch: 20 });
    await b.journal.record(journalEntry({ checkpoint_id: "x", state: "resuming", participants, epoch: 10, prepared_at: 9, updated_at: 9 }));
    b.journal.record = ((record) => async (entry: Parameters<typeof record>[0]) => {
      await record(entry);
      if (entry.checkpoint_id === "x" && entry.state === "resuming") {
        b.leadership.demote();
        b.engine.leadershipLost();
      }
    })(b.journal.record.bind(b.journal));
    await b.engine.recover();
    const rewritten = b.journal.entries.get("x")!;
    expect(rewritten).toMatchObject({ epoch: 20, opened_epoch: 10 });
    expect(rewritten.opened_seq).toBeUndefined();
  });
});
