import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointError } from "../../../protocol/index.js";
import { journalEmptied, journalEntry, makeEngine, writers } from "./fake-participants.js";
import { refusalOf } from "../../support/refusal.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-rewrite-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/**
 * A successor recovering a predecessor's `decided` entry rewrites it as decided (its epoch) before
 * it re-sends the commit. That write failing (a KV timeout, landed or not; or refused because the
 * entry changed since the listing) sent no commit, and the journal still holds the decision: the
 * checkpoint must not be aborted (everyone resumed, the entry removed) for it.
 */
describe("recovery of a decided entry whose rewrite as decided fails", () => {
  const failures: { name: string; landed: boolean; error: () => Error }[] = [
    { name: "a KV timeout (the write lost)", landed: false, error: () => new Error("TIMEOUT") },
    { name: "a KV timeout (the write landed)", landed: true, error: () => new Error("TIMEOUT") },
    { name: "a compare-and-set refusal", landed: false, error: () => new CheckpointError("not_leader", "journal entry d1 was changed by another coordinator") },
  ];
  for (const failure of failures) {
    it(`${failure.name}: nothing is resumed, the decision stays journaled, the gate stays shut; the next recovery completes it`, async () => {
      const { engine, fake, journal, catalog } = makeEngine(root, { requireRecovery: true });
      const participants = fake.members.map((m) => ({ kind: m.kind, instance: m.instance }));
      // A predecessor decided d1 (every participant prepared; two already committed) and died.
      await journal.record(journalEntry({ checkpoint_id: "d1", epoch: 6, state: "decided", participants, checkpoint_dir: join(root, "d1") }));
      for (const m of fake.members) fake.state.set(`${m.kind}.${m.instance}`, { phase: "prepared", checkpoint_id: "d1" });
      fake.state.set("agent.a1", { phase: "committed", checkpoint_id: "d1" });
      fake.state.set("model.m1", { phase: "committed", checkpoint_id: "d1" });
      fake.events.length = 0;
      const record = journal.record.bind(journal);
      journal.record = async (entry) => {
        journal.record = record; // fails once
        if (failure.landed) await record(entry);
        throw failure.error();
      };

      const first = await engine.recover().then(
        (done) => ({ done }),
        (error: unknown) => ({ error }),
      );
      // Nothing aborted it: no resume (which would fence the id where the commit has not arrived yet).
      expect(fake.ops("resume")).toHaveLength(0);
      expect(fake.ops("commit")).toHaveLength(0);
      expect(journal.entries.get("d1")?.state).toBe("decided");
      expect(journal.log.filter((l) => l.op === "remove")).toEqual([]);
      // Recovery did not finish: controller ops stay refused (the daemon runs it again).
      expect(first).toMatchObject({ error: expect.anything() });
      expect(engine.recovered).toBe(false);
      expect((await refusalOf(engine.prepare({ checkpoint_id: "new1" }))).code).toBe("not_leader");
      expect(engine.openCheckpoint).toBeNull();

      // The next recovery re-drives the commit and, the convenience op's, publishes and resumes it.
      expect(await engine.recover()).toEqual([{ checkpoint_id: "d1", action: "committed_published_resumed" }]);
      expect(engine.recovered).toBe(true);
      expect(fake.ops("commit")).toHaveLength(5);
      expect((await catalog.get("d1")).checkpoint_id).toBe("d1");
      expect(await catalog.latest()).toBe("d1");
      await journalEmptied(journal);
    });
  }
});
