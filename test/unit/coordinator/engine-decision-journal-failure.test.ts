import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { toCheckpointError, type CheckpointError } from "../../../protocol/index.js";
import { FOUR_KINDS, journalEmptied, makeEngine, writers } from "./fake-participants.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-decision-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/** The catalog error the controller APIs answer for what `work` throws. */
async function answered(work: Promise<unknown>): Promise<CheckpointError> {
  try {
    await work;
  } catch (error) {
    return toCheckpointError(error);
  }
  throw new Error("expected a refusal");
}

/** A KV put whose acknowledgement never came (a timeout): it may or may not have landed. */
function failDecided(journal: ReturnType<typeof makeEngine>["journal"], landed: boolean): void {
  const record = journal.record.bind(journal);
  journal.record = async (entry) => {
    if (entry.state === "decided") {
      if (landed) await record(entry);
      throw new Error("TIMEOUT");
    }
    await record(entry);
  };
}

describe("a commit decision whose journal write fails or times out", () => {
  for (const landed of [false, true]) {
    it(`checkpoint op (the write ${landed ? "landed" : "lost"}): no commit sent, everyone resumed, nothing published or journaled, outcome_unknown`, async () => {
      const { engine, fake, journal, catalog } = makeEngine(root);
      failDecided(journal, landed);
      const error = await answered(engine.checkpoint({ checkpoint_id: "d1", episode_ids: null, stop: false, controller_state: null }));
      expect(error.code).toBe("outcome_unknown");
      expect(error.message).toContain("no commit was sent");
      expect(fake.ops("commit")).toHaveLength(0);
      expect(new Set(fake.ops("resume").map((c) => `${c.kind}/${c.instance}`)).size).toBe(5);
      expect(engine.openCheckpoint).toBeNull();
      expect(await catalog.latest()).toBeNull();
      await journalEmptied(journal);
    });

    it(`commit op (the write ${landed ? "landed" : "lost"}): no commit sent, still prepared, outcome_unknown; resume aborts it`, async () => {
      const { engine, fake, journal } = makeEngine(root);
      failDecided(journal, landed);
      await engine.prepare({ checkpoint_id: "d2" });
      const error = await answered(engine.commit({ checkpoint_id: "d2", episode_ids: null, stop: false }));
      expect(error.code).toBe("outcome_unknown");
      expect(error.message).toContain("no commit was sent");
      expect(fake.ops("commit")).toHaveLength(0);
      expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "d2", phase: "prepared" });
      await engine.resume({ checkpoint_id: "d2" });
      expect(new Set(fake.ops("resume").map((c) => `${c.kind}/${c.instance}`)).size).toBe(5);
      await journalEmptied(journal);
    });
  }
});

describe("a resume of a committed checkpoint whose decision cannot be withdrawn (a KV timeout)", () => {
  it("sends nothing and answers outcome_unknown, so a controller sends it again (internal_error would be dropped); the retry resumes everyone", async () => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "w1" });
    await engine.commit({ checkpoint_id: "w1", episode_ids: null, stop: false });
    const record = journal.record.bind(journal);
    let failing = true;
    journal.record = async (entry) => {
      if (failing) throw new Error("TIMEOUT");
      await record(entry);
    };
    const error = await answered(engine.resume({ checkpoint_id: "w1" }));
    expect(error.code).toBe("outcome_unknown");
    expect(error.message).toContain("could not be withdrawn");
    expect(fake.ops("resume")).toHaveLength(0);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "w1", phase: "committed" });
    failing = false;
    await engine.resume({ checkpoint_id: "w1" });
    expect(fake.ops("resume")).toHaveLength(5);
    await journalEmptied(journal);
  });
});

/** Every KV put of `state` times out (landed or not) while `failing` stays true. */
function failState(journal: ReturnType<typeof makeEngine>["journal"], state: string, landed: boolean): { failing: boolean } {
  const control = { failing: true };
  const record = journal.record.bind(journal);
  journal.record = async (entry) => {
    if (control.failing && entry.state === state) {
      if (landed) await record(entry);
      throw new Error("TIMEOUT");
    }
    await record(entry);
  };
  return control;
}

const R1 = [{ rollout_id: "r1", attempt: 0 }];

/**
 * docs/errors.md outcome_unknown: "a journal write before anything was sent failed ... nothing was
 * sent, but the write may have landed": the controller sends the op again (internal_error it would
 * drop). A refusal changes nothing, and a `restoring` entry that landed all the same is not left for
 * a successor to re-drive (its clean-up could retire attempt+1 where the controller continues).
 */
describe("a restore, or a restored checkpoint's resume, whose journal write fails (a KV timeout)", () => {
  for (const landed of [false, true]) {
    it(`restore (the write ${landed ? "landed" : "lost"}): nothing sent or opened, outcome_unknown, no restoring entry left; the retry restores`, async () => {
      const { engine, fake, journal } = makeEngine(root);
      await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
      await journalEmptied(journal);
      const control = failState(journal, "restoring", landed);
      const error = await answered(engine.restore({ checkpoint_id: "base", episode_ids: R1 }));
      expect(error.code).toBe("outcome_unknown");
      expect(error.message).toContain("nothing was sent");
      expect(fake.ops("restore")).toHaveLength(0);
      expect(engine.openCheckpoint).toBeNull();
      await journalEmptied(journal);
      control.failing = false;
      expect(await engine.restore({ checkpoint_id: "base", episode_ids: R1 })).toMatchObject({ checkpoint_id: "base" });
      await engine.resume({ checkpoint_id: "base" });
      await journalEmptied(journal);
    });

    // Nothing was sent, so nothing changed: before, the landed entry's plain removal erased the
    // record of how the id's earlier restore settled (the journal's restoreOutcome).
    it(`restore of an id restored before (the write ${landed ? "landed" : "lost"}): the record of that earlier restore stays`, async () => {
      const { engine, journal } = makeEngine(root);
      await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
      await engine.restore({ checkpoint_id: "base", episode_ids: R1 });
      await engine.resume({ checkpoint_id: "base" });
      expect(await journal.restoreOutcome("base")).toBe("restored");
      failState(journal, "restoring", landed);
      expect((await answered(engine.restore({ checkpoint_id: "base", episode_ids: R1 }))).code).toBe("outcome_unknown");
      await journalEmptied(journal);
      expect(await journal.restoreOutcome("base")).toBe("restored");
    });

    if (!landed) {
      it("restore whose read of the id's earlier restore record fails: nothing sent, written or opened, outcome_unknown; the retry restores", async () => {
        const { engine, fake, journal } = makeEngine(root);
        await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
        await journalEmptied(journal);
        const read = journal.restoreOutcome.bind(journal);
        journal.restoreOutcome = async () => {
          throw new Error("TIMEOUT");
        };
        const writes = journal.log.length;
        const error = await answered(engine.restore({ checkpoint_id: "base", episode_ids: R1 }));
        expect(error).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("nothing was sent; send the restore again") });
        expect(fake.ops("restore")).toHaveLength(0);
        expect(journal.log).toHaveLength(writes);
        expect(engine.openCheckpoint).toBeNull();
        journal.restoreOutcome = read;
        expect(await engine.restore({ checkpoint_id: "base", episode_ids: R1 })).toMatchObject({ checkpoint_id: "base" });
      });
    }

    it(`restore of the published checkpoint nobody resumed (the write ${landed ? "landed" : "lost"}): it stays open as published, its entry as it was`, async () => {
      const { engine, fake, journal } = makeEngine(root);
      await engine.prepare({ checkpoint_id: "pub" });
      await engine.commit({ checkpoint_id: "pub", episode_ids: null, stop: false });
      await engine.publish({ checkpoint_id: "pub", controller_state: null });
      const entry = journal.entries.get("pub");
      expect(entry?.state).toBe("decided");
      // Its controller died before the resume; the Gym servers restarted: nobody holds it.
      for (const key of [...fake.state.keys()]) fake.state.set(key, { phase: "idle", checkpoint_id: null });
      const control = failState(journal, "restoring", landed);
      const error = await answered(engine.restore({ checkpoint_id: "pub", episode_ids: R1 }));
      expect(error.code).toBe("outcome_unknown");
      expect(fake.ops("restore")).toHaveLength(0);
      expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "pub", phase: "published" });
      expect(journal.entries.get("pub")).toMatchObject({ state: "decided", checkpoint_dir: entry?.checkpoint_dir, participants: entry?.participants });
      control.failing = false;
      expect(await engine.restore({ checkpoint_id: "pub", episode_ids: R1 })).toMatchObject({ checkpoint_id: "pub" });
      await engine.resume({ checkpoint_id: "pub" });
      await journalEmptied(journal);
    });

    it(`resume of a restored checkpoint (the write ${landed ? "landed" : "lost"}): no resume sent, still restored, outcome_unknown; the retry resumes`, async () => {
      const { engine, fake, journal } = makeEngine(root);
      await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
      await journalEmptied(journal);
      await engine.restore({ checkpoint_id: "base", episode_ids: R1 });
      const resumes = fake.ops("resume").length;
      const control = failState(journal, "resuming", landed);
      const error = await answered(engine.resume({ checkpoint_id: "base" }));
      expect(error.code).toBe("outcome_unknown");
      expect(error.message).toContain("no resume was sent");
      expect(fake.ops("resume")).toHaveLength(resumes);
      expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "base", phase: "restored" });
      control.failing = false;
      await engine.resume({ checkpoint_id: "base" });
      expect(fake.ops("resume")).toHaveLength(resumes + 5);
      await journalEmptied(journal);
    });

    // A restorer restarted before the resume: the resume runs the restore's clean-up, journaled
    // `restore_cleanup` first. Before the fix that write's KV timeout escaped as a plain Error (the
    // controller APIs' internal_error). Found by engine-model.test.ts (seed 13).
    it(`resume of a restored checkpoint a restorer of which restarted (the clean-up's write ${landed ? "landed" : "lost"}): nothing sent, still restored, outcome_unknown; the retry cleans up`, async () => {
      const view = new Map(FOUR_KINDS.map((m) => [`${m.kind}.${m.instance}`, `${m.instance}-0`]));
      const { engine, fake, journal, membership } = makeEngine(root, { incarnations: view });
      await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
      await journalEmptied(journal);
      await engine.restore({ checkpoint_id: "base", episode_ids: R1 });
      membership.announce({ kind: "model", instance: "m1" }, "m1-1"); // m1 restarted since it restored
      const sent = fake.calls.length;
      const control = failState(journal, "restore_cleanup", landed);
      const error = await answered(engine.resume({ checkpoint_id: "base" }));
      expect(error.code).toBe("outcome_unknown");
      expect(fake.calls.slice(sent).filter((c) => c.op !== "status")).toEqual([]);
      expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "base", phase: "restored" });
      control.failing = false;
      expect((await answered(engine.resume({ checkpoint_id: "base" }))).code).toBe("restore_failed");
      await journalEmptied(journal);
    });
  }
});

/**
 * docs/protocol.md: the record of how a restore settled is "not overwritten by a later restore that
 * changed nothing". A restore that closes the id's previous restore (closeIfNobodyHolds: released
 * before its resume) reads the journal while that restore's entry is still there, its removal (which
 * writes restore_failed) not landed yet (a slow KV). Before, the new restore took "no record" for
 * the one before it, and, refused everywhere, purged the key plainly: a later leader then answered
 * the first restore's retried resume as a success, for rollouts nobody restored.
 */
describe("a restore every participant refuses, opened while the removal of the id's previous restore's entry is under way", () => {
  it("leaves the record that removal writes (restore_failed: released before its resume); a successor answers that resume restore_failed", async () => {
    let slowRemoval: Promise<void> | undefined;
    let reached!: () => void;
    const removalReached = new Promise<void>((resolve) => (reached = resolve));
    const hooks = {
      beforeJournalRemove: (id: string) => {
        if (id !== "base" || !slowRemoval) return undefined;
        const held = slowRemoval;
        slowRemoval = undefined; // only the first: the refusal's own removal goes through
        reached();
        return held;
      },
    };
    const { engine, fake, journal, clock } = makeEngine(root, { hooks });
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    await engine.restore({ checkpoint_id: "base", episode_ids: R1 });
    // Its processes restart before its resume: nobody holds it. The next restore is refused by every
    // one of the fresh processes (nothing installed).
    for (const m of FOUR_KINDS) {
      fake.restart(m.kind, m.instance);
      fake.set(m.kind, m.instance, "restore", { error: "invalid_request" });
    }
    let release!: () => void;
    slowRemoval = new Promise<void>((resolve) => (release = resolve));
    const error = await answered(engine.restore({ checkpoint_id: "base", episode_ids: R1 }));
    expect(error.code).toBe("invalid_request");
    await removalReached;
    release();
    await journalEmptied(journal);
    expect(await journal.restoreOutcome("base")).toBe("restore_failed");
    // A leader of a later term answering the first restore's resume, retried.
    const successor = makeEngine(root, { successorOf: { fake, journal, clock }, epoch: 8 });
    await successor.engine.recover();
    expect((await answered(successor.engine.resume({ checkpoint_id: "base" }))).code).toBe("restore_failed");
  });
});

/**
 * docs/api.md prepare: journal_unavailable "a retry of that id among the leader's last 8 such gets
 * the same reply"; "A retry answered from memory is not refused for a past deadline". A controller
 * whose reply was lost retries with the same body once its wait (deadline_ts + slack) is over: it
 * must learn the id is spent, not `deadline_exceeded` ("it never ran"). Found by engine-model.test.ts.
 */
describe("a checkpoint aborted because its open entry could not be journaled, retried after its deadline", () => {
  for (const op of ["checkpoint", "prepare"] as const) {
    it(`${op}: the retry gets journal_unavailable again, nothing sent`, async () => {
      const { engine, fake, journal, clock } = makeEngine(root);
      const control = failState(journal, "open", false);
      const deadline_ts = clock.now() / 1000 + 60;
      const send = () =>
        op === "checkpoint"
          ? engine.checkpoint({ checkpoint_id: "nj1", deadline_ts, episode_ids: R1, stop: false, controller_state: null })
          : engine.prepare({ checkpoint_id: "nj1", deadline_ts });
      const first = await answered(send());
      expect(first.code).toBe("journal_unavailable");
      control.failing = false;
      clock.current += 70_000; // the reply was lost; the client retries after its wait
      const sent = fake.calls.length;
      const again = await answered(send());
      expect([again.code, again.message]).toEqual(["journal_unavailable", first.message]);
      expect(fake.calls.length).toBe(sent);
    });
  }
});

/** An engine whose checkpoint `base` was restored and resumed, the journal recording that restore (`restored`). */
async function engineWithBaseRestored(): Promise<ReturnType<typeof makeEngine>> {
  const world = makeEngine(root);
  const { engine, journal } = world;
  await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
  await engine.restore({ checkpoint_id: "base", episode_ids: R1 });
  await engine.resume({ checkpoint_id: "base" });
  await journalEmptied(journal);
  expect(await journal.restoreOutcome("base")).toBe("restored");
  return world;
}

/** The ids in the engine's map of records its scheduled removals write (private: restoreRecords). */
function removalRecordIds(engine: ReturnType<typeof makeEngine>["engine"]): string[] {
  return [...(engine as unknown as { restoreRecords: Map<string, string> }).restoreRecords.keys()];
}

/**
 * The reviewers' HA case: leadership is lost while a restore's sends are in flight, and then every
 * participant refuses it. refuseRestore read the leader term only then, after leadershipLost
 * emptied this term's map of removal records: it noted the id's earlier restore record in the NEXT
 * term's map (a later restore of the id, its key holding an entry, would take that record for the
 * journal's), and its removal ran as the next term's, deleting the `restoring` entry that term's
 * recovery is to finish. As the failed-write path does, a deposed refusal notes and removes nothing.
 */
describe("a restore every participant refuses after leadership was lost while its sends were in flight", () => {
  for (const regained of [false, true]) {
    it(`notes no record in the next term and leaves its entry to that term (${regained ? "leading again" : "deposed"}); outcome_unknown`, async () => {
      const { engine, fake, journal, leadership } = await engineWithBaseRestored();
      for (const m of FOUR_KINDS) fake.set(m.kind, m.instance, "restore", { error: "invalid_request" });
      const held = fake.hold("model", "m1", "restore");
      const restore = answered(engine.restore({ checkpoint_id: "base", episode_ids: R1 }));
      await held.reached;
      engine.leadershipLost();
      if (!regained) leadership.demote();
      held.release();
      expect((await restore).code).toBe("outcome_unknown");
      // The `restoring` entry is the next term's: its recovery sends the restore again and settles it.
      expect(journal.entries.get("base")).toMatchObject({ state: "restoring" });
      expect(removalRecordIds(engine)).toEqual([]);
    });
  }
});

/**
 * The same HA case one step earlier: leadership is lost while a restore reads the journal's record
 * of the id's earlier restore (restoreOutcome, before anything is written or sent). The restore
 * read its leader term only after that read: deposed, its journal write refused not_leader, and its
 * failed-write path, taking the refusal for this term's, noted the earlier record in the NEXT term's
 * map and scheduled a removal as that term's. Leading again (the fixture keeps its epoch), it wrote
 * and sent the restore on a journal read of the term before. A read that outlived its term sends,
 * writes and notes nothing: not_leader, which the controller retries.
 */
describe("a restore whose read of the id's earlier restore record outlives the leader term", () => {
  for (const regained of [false, true]) {
    it(`sends, writes and notes nothing (${regained ? "leading again" : "deposed"}); not_leader`, async () => {
      const { engine, fake, journal, leadership } = await engineWithBaseRestored();
      const read = journal.restoreOutcome.bind(journal);
      let reached!: () => void;
      const readReached = new Promise<void>((resolve) => (reached = resolve));
      let release!: () => void;
      const held = new Promise<void>((resolve) => (release = resolve));
      journal.restoreOutcome = async (id) => {
        reached();
        await held;
        return read(id);
      };
      const writes = journal.log.length;
      const restores = fake.ops("restore").length;
      const restore = answered(engine.restore({ checkpoint_id: "base", episode_ids: R1 }));
      await readReached;
      engine.leadershipLost();
      if (!regained) leadership.demote();
      release();
      expect((await restore).code).toBe("not_leader");
      journal.restoreOutcome = read;
      expect(fake.ops("restore")).toHaveLength(restores);
      expect(journal.log).toHaveLength(writes);
      expect(engine.openCheckpoint).toBeNull();
      expect(removalRecordIds(engine)).toEqual([]);
      expect(await journal.restoreOutcome("base")).toBe("restored");
    });
  }
});
