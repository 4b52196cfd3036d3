import { mkdtemp, readdir, readFile, rename, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { JournalEntry } from "../../../coordinator/ha/decision-journal.js";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { FakeParticipants, FOUR_KINDS, journalEmptied, makeEngine, writers } from "./fake-participants.js";
import { refusalOf } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-recovery-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/** A checkpoint published by a coordinator that died before resuming it: its decided entry and checkpoint.json. */
async function publishedNotResumed(id: string, options: { stop?: boolean; state?: { inline: unknown } } = {}): Promise<JournalEntry> {
  const first = makeEngine(root);
  await first.engine.prepare({ checkpoint_id: id });
  await first.engine.commit({ checkpoint_id: id, episode_ids: null, stop: options.stop ?? false });
  // Taken before publish: with stop, publish closes the checkpoint (and removes the entry) at once.
  const entry = structuredClone(first.journal.entries.get(id));
  if (!entry) throw new Error(`no journal entry for ${id}`);
  expect(entry.state).toBe("decided");
  await first.engine.publish({ checkpoint_id: id, controller_state: options.state ?? null });
  await first.writer.settled();
  return entry;
}

/** A successor coordinator over the same root and journal. */
async function successor(entry: JournalEntry) {
  const second = makeEngine(root);
  await second.journal.record(entry);
  second.fake.events.length = 0;
  return second;
}

describe("recovery of a published, unresumed checkpoint", () => {
  it("into restarted participants: sends no resume, and restoring it afterwards works", async () => {
    const entry = await publishedNotResumed("x1");
    const second = await successor(entry); // its participants are fresh processes: idle, holding nothing
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "x1", action: "published_closed" }]);
    expect(second.fake.ops("resume")).toHaveLength(0);
    await journalEmptied(second.journal);
    // The next controller restores LATEST (= x1); nothing fenced it.
    const restored = await second.engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(restored.checkpoint_id).toBe("x1");
    expect(second.fake.ops("restore")).toHaveLength(5);
    // A late resume of x1 by the old controller sends nothing either.
    await second.engine.resume({ checkpoint_id: "x1" }); // closes the restore (same id)
    expect(await second.engine.resume({ checkpoint_id: "x1" })).toEqual({ checkpoint_id: "x1", participants: [] });
  });

  it("with participants still parked on it: stays open as published; the controller's resume resumes everyone", async () => {
    const entry = await publishedNotResumed("x2");
    const second = await successor(entry);
    for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "committed", checkpoint_id: "x2" });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "x2", action: "published_open" }]);
    expect(second.fake.ops("resume")).toHaveLength(0);
    expect(second.engine.openCheckpoint).toMatchObject({ checkpoint_id: "x2", phase: "published" });
    const resumed = await second.engine.resume({ checkpoint_id: "x2" });
    expect(resumed.participants).toHaveLength(5);
    expect(second.fake.ops("resume")).toHaveLength(5);
    expect(second.engine.openCheckpoint).toBeNull();
    await journalEmptied(second.journal);
  });

  it("left open as published: once every participant resumed on its own (lease), a new checkpoint or a retire closes it instead of being refused", async () => {
    for (const next of ["prepare", "retire"] as const) {
      const id = `x2-${next}`;
      const entry = await publishedNotResumed(id);
      const second = await successor(entry);
      for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "committed", checkpoint_id: id });
      expect(await second.engine.recover()).toEqual([{ checkpoint_id: id, action: "published_open" }]);
      // still held: refused, and it stays open
      const refused = await refusalOf(next === "prepare" ? second.engine.prepare({ checkpoint_id: `${id}-next` }) : second.engine.retire({ episode_ids: [{ rollout_id: "r9", attempt: 0 }] }));
      expect(refused.code).toBe(next === "prepare" ? "checkpoint_conflict" : "invalid_phase");
      expect(second.engine.openCheckpoint).toMatchObject({ checkpoint_id: id, phase: "published" });
      // their leases expire: every status shows idle
      for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "idle", checkpoint_id: null });
      if (next === "prepare") expect(await second.engine.prepare({ checkpoint_id: `${id}-next` })).toMatchObject({ prepared: true });
      else await second.engine.retire({ episode_ids: [{ rollout_id: "r9", attempt: 0 }] });
      expect(second.fake.ops("resume")).toHaveLength(0); // nobody was sent a resume of it
      await waitUntil(() => !second.journal.entries.has(id), "the closed checkpoint's journal entry to go", 5000);
    }
  });

  it("a publish naming another controller state is checkpoint_conflict, as at the leader that published it, open or not; the published state gets its reply", async () => {
    const entry = await publishedNotResumed("x9", { state: { inline: { step: 1 } } });
    const second = await successor(entry);
    for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "committed", checkpoint_id: "x9" });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "x9", action: "published_open" }]);
    const other = { checkpoint_id: "x9", controller_state: { inline: { step: 2 } } };
    expect((await refusalOf(second.engine.publish(other))).code).toBe("checkpoint_conflict");
    await second.engine.resume({ checkpoint_id: "x9" });
    expect((await refusalOf(second.engine.publish(other))).code).toBe("checkpoint_conflict");
    const manifest = await second.catalog.get("x9");
    expect(manifest.controller_state).toEqual({ inline: { step: 1 } });
    expect(await second.engine.publish({ checkpoint_id: "x9", controller_state: { inline: { step: 1 } } })).toEqual({
      checkpoint_id: "x9",
      manifest_path: join(root, "x9", "checkpoint.json"),
      published_at: manifest.published_at,
      deleted: [],
    });
  });

  it("of the convenience op, with some participants still parked on it: resumes those (only), closes it, and a retry of the op gets its reply", async () => {
    const entry = await publishedNotResumed("x7");
    const second = await successor({ ...entry, auto_publish: true });
    second.fake.state.set("model.m1", { phase: "committed", checkpoint_id: "x7" });
    second.fake.state.set("agent.a1", { phase: "committed", checkpoint_id: "x7" });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "x7", action: "published_resumed" }]);
    // The fresh processes are not sent a resume that would fence x7 for a later restore of LATEST.
    expect(second.fake.ops("resume").map((c) => `${c.kind}/${c.instance}`).sort()).toEqual(["agent/a1", "model/m1"]);
    expect(second.engine.openCheckpoint).toBeNull();
    await journalEmptied(second.journal);
    // The controller saw its checkpoint op fail when the predecessor died; its retry succeeds.
    const retried = await second.engine.checkpoint({ checkpoint_id: "x7", episode_ids: null, stop: false, controller_state: null });
    expect(retried).toMatchObject({ checkpoint_id: "x7", participants: 5, resume_failures: [] });
    expect(second.fake.ops("prepare")).toHaveLength(0);
    await second.engine.checkpoint({ checkpoint_id: "x8", episode_ids: null, stop: false, controller_state: null }); // not blocked
  });

  it("with participants still parked on it: a restore is refused until they are gone; the next controller's restore then closes it without a resume", async () => {
    const entry = await publishedNotResumed("x3");
    const second = await successor(entry);
    second.fake.state.set("model.m1", { phase: "committed", checkpoint_id: "x3" });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "x3", action: "published_open" }]);
    // m1 still parked in x3 would refuse a restore (it needs a fresh process), and the clean-up
    // would retire attempt+1 on the live servers: refused before anything is journaled or sent.
    const parked = await refusalOf(second.engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(parked.code).toBe("invalid_phase");
    expect(parked.message).toContain("model/m1");
    expect(second.fake.ops("restore")).toHaveLength(0);
    expect(second.fake.ops("retire")).toHaveLength(0);
    expect(second.engine.openCheckpoint).toMatchObject({ checkpoint_id: "x3", phase: "published" });
    expect(second.journal.entries.get("x3")?.state).toBe(entry.state);
    second.fake.state.delete("model.m1"); // m1 restarted: a fresh process, holding nothing
    // A restore refused (here: a scope too large to journal) changes nothing: x3 stays open, journaled.
    const huge = Array.from({ length: 25_000 }, (_, i) => ({ rollout_id: `rollout-${String(i).padStart(8, "0")}`, attempt: 0 }));
    await expect(second.engine.restore({ episode_ids: huge })).rejects.toMatchObject({ code: "payload_too_large" });
    expect(second.engine.openCheckpoint).toMatchObject({ checkpoint_id: "x3", phase: "published" });
    await second.writer.settled();
    expect(second.journal.entries.has("x3")).toBe(true);
    const restored = await second.engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(restored.checkpoint_id).toBe("x3");
    expect(second.fake.ops("resume")).toHaveLength(0);
    expect(second.engine.openCheckpoint).toMatchObject({ checkpoint_id: "x3", phase: "restored" });
  });

  it("of the convenience op, with the others resumed and one not answering its status: closed (that one resumes by its lease), a retry gets the reply", async () => {
    const entry = await publishedNotResumed("x9");
    const second = await successor({ ...entry, auto_publish: true });
    second.fake.set("agent", "a1", "status", "unreachable");
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "x9", action: "published_closed" }]);
    expect(second.fake.ops("resume")).toHaveLength(0);
    expect(second.engine.openCheckpoint).toBeNull();
    expect(await second.engine.checkpoint({ checkpoint_id: "x9", episode_ids: null, stop: false, controller_state: null })).toMatchObject({ checkpoint_id: "x9", participants: 5 });
    expect(second.fake.ops("prepare")).toHaveLength(0);
  });

  it("a participant that does not answer its status may still hold it: stays open", async () => {
    const entry = await publishedNotResumed("x4");
    const second = await successor(entry);
    second.fake.set("agent", "a1", "status", "unreachable");
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "x4", action: "published_open" }]);
    expect(second.fake.ops("resume")).toHaveLength(0);
  });

  it("stop: closed without a resume (participants stay parked by design)", async () => {
    const entry = await publishedNotResumed("x5", { stop: true });
    const second = await successor(entry);
    for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "committed", checkpoint_id: "x5" });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "x5", action: "published_stopped" }]);
    expect(second.fake.ops("resume")).toHaveLength(0);
    expect(second.engine.openCheckpoint).toBeNull();
  });
});

describe("restore of a checkpoint this coordinator published and did not resume", () => {
  it("is refused while its participants still hold it, with nothing sent or retired; after the resume it restores", async () => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "p1" });
    await engine.commit({ checkpoint_id: "p1", episode_ids: null, stop: false });
    await engine.publish({ checkpoint_id: "p1", controller_state: null });
    const journaled = structuredClone(journal.entries.get("p1"));
    const refused = await refusalOf(engine.restore({ episode_ids: [{ rollout_id: "r0", attempt: 0 }] }));
    expect(refused.code).toBe("invalid_phase");
    expect(fake.ops("restore")).toHaveLength(0);
    expect(fake.ops("retire")).toHaveLength(0);
    expect(fake.ops("resume")).toHaveLength(0);
    expect(journal.entries.get("p1")).toEqual(journaled);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "p1", phase: "published" });
    expect((await engine.resume({ checkpoint_id: "p1" })).participants).toHaveLength(5);
    expect((await engine.restore({ episode_ids: [{ rollout_id: "r0", attempt: 0 }] })).checkpoint_id).toBe("p1");
  });
});

describe("recovery repairs LATEST after a crash between checkpoint.json and LATEST's rename", () => {
  it("points LATEST at the recovered checkpoint, durably, so a default restore picks it", async () => {
    const first = makeEngine(root);
    await first.engine.checkpoint({ checkpoint_id: "older", episode_ids: null, stop: false, controller_state: null });
    first.clock.current += 60_000;
    await first.engine.prepare({ checkpoint_id: "newer" });
    await first.engine.commit({ checkpoint_id: "newer", episode_ids: null, stop: false });
    await first.engine.publish({ checkpoint_id: "newer", controller_state: null });
    const entry = structuredClone(first.journal.entries.get("newer")!);
    await first.writer.settled();
    // The crash: checkpoint.json of "newer" is durable, LATEST was never renamed.
    await writeFile(join(root, "LATEST"), "older\n");
    const second = await successor(entry);
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "newer", action: "published_closed" }]);
    expect(await readFile(join(root, "LATEST"), "utf8")).toBe("newer\n");
    expect((await readdir(root)).filter((n) => n.endsWith(".tmp"))).toEqual([]);
    expect((await second.engine.restore({ episode_ids: [] })).checkpoint_id).toBe("newer");
  });

  it("a repair the storage refuses (EIO) leaves the entry journaled for a later recovery, instead of closing it with LATEST naming the older checkpoint", async () => {
    const first = makeEngine(root);
    await first.engine.checkpoint({ checkpoint_id: "older", episode_ids: null, stop: false, controller_state: null });
    first.clock.current += 60_000;
    await first.engine.prepare({ checkpoint_id: "newer" });
    await first.engine.commit({ checkpoint_id: "newer", episode_ids: null, stop: false });
    await first.engine.publish({ checkpoint_id: "newer", controller_state: null });
    const entry = structuredClone(first.journal.entries.get("newer")!);
    await first.writer.settled();
    await writeFile(join(root, "LATEST"), "older\n"); // the crash before LATEST's rename
    const second = await successor(entry);
    second.writer.repairLatest = async () => {
      throw Object.assign(new Error(`EIO: i/o error, open '${join(root, "LATEST")}'`), { code: "EIO", syscall: "open" });
    };
    // Before: published_closed, its entry removed, and nothing would ever point LATEST at it.
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "newer", action: "failed" }]);
    expect(second.journal.entries.get("newer")?.state).toBe("decided");
    expect(await readFile(join(root, "LATEST"), "utf8")).toBe("older\n");
    // No success kept for a retried publish while LATEST names the older checkpoint.
    expect((await refusalOf(second.engine.publish({ checkpoint_id: "newer", controller_state: null }))).code).toBe("invalid_phase");
    // The next recovery, the storage answering again, repairs it.
    const third = await successor(second.journal.entries.get("newer")!);
    expect(await third.engine.recover()).toEqual([{ checkpoint_id: "newer", action: "published_closed" }]);
    expect(await readFile(join(root, "LATEST"), "utf8")).toBe("newer\n");
  });

  it("a recovering leader deposed during the repair leaves LATEST as it is (the successor's to keep) and closes nothing", async () => {
    const first = makeEngine(root);
    await first.engine.checkpoint({ checkpoint_id: "older", episode_ids: null, stop: false, controller_state: null });
    first.clock.current += 60_000;
    await first.engine.prepare({ checkpoint_id: "newer" });
    await first.engine.commit({ checkpoint_id: "newer", episode_ids: null, stop: false });
    await first.engine.publish({ checkpoint_id: "newer", controller_state: null });
    const entry = structuredClone(first.journal.entries.get("newer")!);
    await first.writer.settled();
    await writeFile(join(root, "LATEST"), "older\n"); // the crash before LATEST's rename
    const second = await successor(entry);
    // Its lease lost while the repair reads the checkpoints (a stall): a successor leads from here.
    const get = second.catalog.get.bind(second.catalog);
    second.catalog.get = async (id) => {
      const manifest = await get(id);
      if (id === "newer") second.leadership.demote();
      return manifest;
    };
    await second.engine.recover().catch(() => undefined);
    expect(await readFile(join(root, "LATEST"), "utf8")).toBe("older\n");
    expect(second.journal.entries.get("newer")?.state).toBe("decided");
  });

  it("a checkpoint.json of its own that is damaged (no storage failure: no recovery could point LATEST at it) is closed as before, not kept for a later recovery", async () => {
    const entry = await publishedNotResumed("dmg");
    await writeFile(join(root, "dmg", "checkpoint.json"), "not json");
    await rm(join(root, "LATEST")); // the crash before LATEST's rename
    const second = await successor(entry);
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "dmg", action: "published_closed" }]);
    await journalEmptied(second.journal);
  });

  it("stop: LATEST is repaired as well", async () => {
    const entry = await publishedNotResumed("last", { stop: true });
    await rm(join(root, "LATEST"));
    const second = await successor(entry);
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "last", action: "published_stopped" }]);
    expect(await second.catalog.latest()).toBe("last");
  });

  it("never moves LATEST back: an entry older than LATEST outlived its close and is closed without a message", async () => {
    const first = makeEngine(root);
    await first.engine.prepare({ checkpoint_id: "stale" });
    await first.engine.commit({ checkpoint_id: "stale", episode_ids: null, stop: false });
    const entry = structuredClone(first.journal.entries.get("stale")!);
    await first.engine.publish({ checkpoint_id: "stale", controller_state: null });
    await first.engine.resume({ checkpoint_id: "stale" }); // its entry's removal is what a crash lost
    first.clock.current += 60_000;
    await first.engine.checkpoint({ checkpoint_id: "fresh", episode_ids: null, stop: false, controller_state: null });
    await first.writer.settled();
    const second = await successor(entry);
    for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "committed", checkpoint_id: "stale" });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "stale", action: "superseded_closed" }]);
    expect(await second.catalog.latest()).toBe("fresh");
    expect(second.fake.ops("resume")).toHaveLength(0);
    expect(second.engine.openCheckpoint).toBeNull();
  });
});

describe("recovery of an entry older than LATEST while LATEST is damaged", () => {
  // A leftover entry (its removal lost) of a checkpoint published before the newest one, and a
  // LATEST that names nothing readable: the newest checkpoint.json that reads back stands in for
  // it, so LATEST is never moved back to the leftover's checkpoint.
  for (const damage of ["garbage", "missing", "names a damaged checkpoint.json"] as const) {
    it(`published (LATEST ${damage}): closed without a message, LATEST not moved to it`, async () => {
      const first = makeEngine(root, { retention: 3 });
      await first.engine.prepare({ checkpoint_id: "stale" });
      await first.engine.commit({ checkpoint_id: "stale", episode_ids: null, stop: false });
      const entry = structuredClone(first.journal.entries.get("stale")!);
      await first.engine.publish({ checkpoint_id: "stale", controller_state: null });
      await first.engine.resume({ checkpoint_id: "stale" });
      first.clock.current += 60_000;
      await first.engine.checkpoint({ checkpoint_id: "fresh", episode_ids: null, stop: false, controller_state: null });
      first.clock.current += 60_000;
      await first.engine.checkpoint({ checkpoint_id: "broken", episode_ids: null, stop: false, controller_state: null });
      await first.writer.settled();
      await writeFile(join(root, "broken", "checkpoint.json"), "{");
      if (damage === "garbage") await writeFile(join(root, "LATEST"), "\u0000\u0000\n");
      if (damage === "missing") await rm(join(root, "LATEST"));
      const before = await readFile(join(root, "LATEST")).catch(() => null);
      const second = await successor(entry);
      expect(await second.engine.recover()).toEqual([{ checkpoint_id: "stale", action: "superseded_closed" }]);
      expect(await readFile(join(root, "LATEST")).catch(() => null)).toEqual(before);
      expect(second.fake.ops("resume")).toHaveLength(0);
    });
  }

  it("decided: resumed (presumed abort), never completed", async () => {
    const first = makeEngine(root);
    await first.engine.prepare({ checkpoint_id: "old-dec" });
    await first.engine.commit({ checkpoint_id: "old-dec", episode_ids: null, stop: false });
    const entry = structuredClone(first.journal.entries.get("old-dec")!);
    await first.engine.resume({ checkpoint_id: "old-dec" });
    first.clock.current += 1000;
    await first.engine.checkpoint({ checkpoint_id: "new-pub", episode_ids: null, stop: false, controller_state: null });
    await first.writer.settled();
    await writeFile(join(root, "LATEST"), "not a checkpoint id!\n");
    const second = await successor(entry);
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "old-dec", action: "decision_overtaken_resumed" }]);
    expect(second.fake.ops("commit")).toHaveLength(0);
    expect(await readFile(join(root, "LATEST"), "utf8")).toBe("not a checkpoint id!\n");
    await expect(new CheckpointCatalog(root).get("old-dec")).rejects.toMatchObject({ code: "not_found" });
  });
});

describe("a decided checkpoint whose directory a successor finds replaced by a symbolic link", () => {
  it("is resumed (presumed abort): no commit is sent through the link and nothing is published there", async () => {
    const first = makeEngine(root);
    await first.engine.prepare({ checkpoint_id: "dec-link" });
    await first.engine.commit({ checkpoint_id: "dec-link", episode_ids: null, stop: false });
    const entry = structuredClone(first.journal.entries.get("dec-link")!);
    const outside = await mkdtemp(join(tmpdir(), "gym-ckpt-recovery-outside-"));
    try {
      await rename(join(root, "dec-link"), join(outside, "dec-link"));
      await symlink(join(outside, "dec-link"), join(root, "dec-link"));
      const second = await successor({ ...entry, state: "decided" });
      expect(await second.engine.recover()).toEqual([{ checkpoint_id: "dec-link", action: "commit_failed_resumed" }]);
      expect(second.fake.ops("commit")).toHaveLength(0);
      expect(await readdir(join(outside, "dec-link"))).not.toContain("checkpoint.json");
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });
});

describe("a deposed leader writes nothing at publication", () => {
  it("leadership is asserted again right before checkpoint.json and LATEST are written", async () => {
    const { engine, leadership, catalog } = makeEngine(root, { retention: 1 });
    await engine.checkpoint({ checkpoint_id: "kept", episode_ids: null, stop: false, controller_state: null });
    await engine.prepare({ checkpoint_id: "late" });
    await engine.commit({ checkpoint_id: "late", episode_ids: null, stop: false });
    // Demoted after publish's first check, while it awaits its staged LATEST.
    const assert = leadership.assert.bind(leadership);
    let checks = 0;
    leadership.assert = (epoch) => {
      if (++checks === 2) leadership.demote();
      assert(epoch);
    };
    await expect(engine.publish({ checkpoint_id: "late", controller_state: null })).rejects.toMatchObject({ code: "not_leader" });
    expect(catalog.has("late")).toBe(false);
    expect(await catalog.latest()).toBe("kept");
  });
});

describe("a leader deposed with a checkpoint open leaves no staged LATEST temp file", () => {
  it("the temp file staged at prepare is removed once leadership is lost; the checkpoint directory stays for the successor, and a later publication by this process sweeps nothing of it", async () => {
    const { engine, writer, catalog } = makeEngine(root, { retention: 1 });
    const temps = async () => (await readdir(root)).filter((name) => name.startsWith(".LATEST.") && name.endsWith(".tmp"));
    await engine.prepare({ checkpoint_id: "deposed" });
    await writer.settled(); // the staging, LATEST's temp file included
    expect(await temps()).toHaveLength(1);
    engine.leadershipLost();
    await writer.settled();
    expect(await temps()).toEqual([]);
    expect((await readdir(root)).includes("deposed")).toBe(true);
    // This process leads again: its own publications' sweeps would have skipped the file for good.
    await engine.recover();
    await engine.checkpoint({ checkpoint_id: "next", episode_ids: null, stop: false, controller_state: null });
    await writer.settled();
    expect(await temps()).toEqual([]);
    expect(await catalog.latest()).toBe("next");
  });
});

describe("recovery with a journaled checkpoint left open and an unjournaled orphan", () => {
  it("of two entries a recovery would leave open, the newer wins and the leftover older one is closed", async () => {
    const newer = await publishedNotResumed("ckpt-b-newer");
    const second = await successor(newer);
    // A restore's entry whose removal a crash cut short, journaled before the newer checkpoint opened
    // (and listed after it: ids do not sort by time). Opened by the leader before (recovery goes by
    // the order entries opened in), rewritten under the newer one's epoch.
    const leftover: JournalEntry = { ...newer, checkpoint_id: "ckpt-z-older", state: "restored", prepared_at: newer.prepared_at - 60, scope: [], opened_epoch: newer.epoch - 1, opened_seq: 1 };
    await second.journal.record(leftover);
    for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "committed", checkpoint_id: "ckpt-b-newer" });
    // m1 does not answer its status, so it may still hold the leftover: recovery re-drives it.
    second.fake.set("model", "m1", "status", "unreachable");
    const done = await second.engine.recover();
    expect(done).toEqual([
      { checkpoint_id: "ckpt-z-older", action: "restored" },
      { checkpoint_id: "ckpt-z-older", action: "superseded_closed" },
      { checkpoint_id: "ckpt-b-newer", action: "published_open" },
    ]);
    expect(second.engine.openCheckpoint).toMatchObject({ checkpoint_id: "ckpt-b-newer", phase: "published" });
    expect([...second.journal.entries.keys()]).toEqual(["ckpt-b-newer"]);
  });

  it("the status probe carries the new leader's epoch (participants raise their fence before it serves); one found prepared by a deposed leader is resumed", async () => {
    const { engine, fake } = makeEngine(root, { requireRecovery: true });
    fake.state.set("environment.e1", { phase: "prepared", checkpoint_id: "from-deposed" });
    expect(await engine.recover()).toEqual([{ checkpoint_id: "from-deposed", action: "resumed_unjournaled" }]);
    const statuses = fake.ops("status");
    expect(statuses.map((c) => c.body)).toEqual(Array(5).fill({ epoch: 7 }));
    // Every probe went out before the first other message and before ops are served.
    expect(Math.max(...statuses.map((c) => c.seq))).toBeLessThan(Math.min(...fake.calls.filter((c) => c.op !== "status").map((c) => c.seq)));
    expect(fake.ops("resume").map((c) => `${c.kind}/${c.instance}@${String(c.body.epoch)}`)).toEqual(["environment/e1@7"]);
    expect(engine.recovered).toBe(true);
  });

  it("a resume of an id the leader does not have open (a deposed leader's prepare parked a participant the probe missed) resumes the participants holding it, only those", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.recover();
    fake.state.set("agent.a1", { phase: "prepared", checkpoint_id: "late-x" });
    fake.calls.length = 0;
    const reply = await engine.resume({ checkpoint_id: "late-x" });
    expect(reply).toEqual({ checkpoint_id: "late-x", participants: [{ kind: "agent", instance: "a1", idempotent: false }] });
    expect(fake.ops("resume").map((c) => ({ to: `${c.kind}/${c.instance}`, epoch: c.body.epoch, incarnation: c.body.incarnation }))).toEqual([{ to: "agent/a1", epoch: 7, incarnation: undefined }]);
    expect(engine.openCheckpoint).toBeNull();
    expect(fake.state.get("agent.a1")?.phase).toBe("idle");
    // Closed here now: a retry is idempotent and sends nothing.
    fake.calls.length = 0;
    expect(await engine.resume({ checkpoint_id: "late-x" })).toEqual({ checkpoint_id: "late-x", participants: [] });
    expect(fake.calls).toHaveLength(0);
    // Held nowhere: not_found, and only status requests went out.
    expect((await refusalOf(engine.resume({ checkpoint_id: "never-seen" }))).code).toBe("not_found");
    expect(fake.calls.map((c) => c.op)).toEqual(Array(5).fill("status"));
    expect((await engine.prepare({ checkpoint_id: "next" })).prepared).toBe(true);
  });

  it("resuming the orphan does not drop the open checkpoint", async () => {
    const entry = await publishedNotResumed("kept-open");
    const second = await successor(entry);
    for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "committed", checkpoint_id: "kept-open" });
    second.fake.state.set("resources.r1", { phase: "prepared", checkpoint_id: "orphan" });
    expect(await second.engine.recover()).toEqual([
      { checkpoint_id: "kept-open", action: "published_open" },
      { checkpoint_id: "orphan", action: "resumed_unjournaled" },
    ]);
    expect(second.engine.openCheckpoint).toMatchObject({ checkpoint_id: "kept-open", phase: "published" });
    expect((await second.engine.resume({ checkpoint_id: "kept-open" })).participants).toHaveLength(5);
  });

  it("leadership lost while resuming the orphan: the open checkpoint is not put back on the deposed leader", async () => {
    const entry = await publishedNotResumed("kept-open2");
    const second = await successor(entry);
    for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "committed", checkpoint_id: "kept-open2" });
    second.fake.state.set("resources.r1", { phase: "prepared", checkpoint_id: "orphan2" });
    const request = second.fake.request.bind(second.fake);
    second.fake.request = async (subject, body, options) => {
      if (subject.endsWith(".resume")) second.engine.leadershipLost();
      return request(subject, body, options);
    };
    await second.engine.recover();
    expect(second.engine.openCheckpoint).toBeNull();
  });
});

describe("the journal entry outlives the checkpoint until LATEST's rename is durable", () => {
  it("is removed only after the root directory's fsync (run after the reply), never in place of a newer entry for the id, and kept if that fsync failed", async () => {
    const { engine, journal, writer, catalog } = makeEngine(root);
    let finish!: (error?: Error) => void;
    const durable = new Promise<void>((resolve, reject) => (finish = (error) => (error ? reject(error) : resolve())));
    durable.catch(() => undefined);
    writer.durable = () => durable;
    await engine.checkpoint({ checkpoint_id: "z1", episode_ids: null, stop: false, controller_state: null });
    expect(await catalog.latest()).toBe("z1"); // visible at once; only its durability is pending
    expect(journal.entries.get("z1")?.state).toBe("decided"); // an OS crash now: recovery repairs LATEST from it
    finish();
    await journalEmptied(journal);

    // A restore of the same checkpoint while that removal waits: its entry is not the one removed.
    const again = makeEngine(root);
    let finishAgain!: () => void;
    const pending = new Promise<void>((resolve) => (finishAgain = resolve));
    again.writer.durable = () => pending;
    await again.engine.checkpoint({ checkpoint_id: "z3", episode_ids: null, stop: true, controller_state: null });
    await again.engine.restore({ checkpoint_id: "z3", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(again.journal.entries.get("z3")?.state).toBe("restored");
    finishAgain();
    await pending; // the engine's removal callback, registered first, has run
    expect(again.journal.entries.get("z3")?.state).toBe("restored");
    // …until the restore is resumed (closed): then it goes.
    await again.engine.resume({ checkpoint_id: "z3" });
    await journalEmptied(again.journal);

    const failing = makeEngine(root);
    const fsyncFailed = Promise.reject(new Error("EIO"));
    fsyncFailed.catch(() => undefined);
    failing.writer.durable = () => fsyncFailed;
    await failing.engine.checkpoint({ checkpoint_id: "z2", episode_ids: null, stop: false, controller_state: null });
    await fsyncFailed.catch(() => undefined); // the engine's handler, registered first, has run
    expect(failing.journal.entries.get("z2")?.state).toBe("decided");
  });
});

describe("a restore of a closed checkpoint journaled while its old entry's removal is under way", () => {
  it("keeps the restore's entry: the removal checks for a newer write right before it removes", async () => {
    let restoring: Promise<unknown> | undefined;
    const world = makeEngine(root, {
      hooks: {
        // The removal's last await before it removes: a restore of z5 journals there.
        beforeJournalRemove: async (id) => {
          if (id !== "z5" || restoring) return;
          restoring = world.engine.restore({ checkpoint_id: "z5", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
          await restoring;
        },
      },
    });
    await world.engine.checkpoint({ checkpoint_id: "z5", episode_ids: null, stop: true, controller_state: null });
    await waitUntil(() => restoring !== undefined, "the removal of z5's entry to start", 5000);
    await restoring;
    await waitUntil(() => world.journal.log.some((l) => l.op === "record" && l.checkpoint_id === "z5" && l.state === "restored"), "the restore to journal z5", 5000);
    // The removal goes on in microtasks once the hook settles (the memory journal does no I/O):
    // they have all run by the next macrotask. It must see the restore's writes and keep the entry.
    await new Promise((resolve) => setImmediate(resolve));
    expect(world.journal.entries.get("z5")?.state).toBe("restored");
    expect(world.journal.log.filter((l) => l.checkpoint_id === "z5").map((l) => l.op).slice(-1)).toEqual(["record"]);
  });
});

describe("a failed removal of a closed checkpoint's journal entry (a KV timeout)", () => {
  /** Makes the next `n` removals fail; `onFailure` runs at each. Returns the removals tried. */
  function failRemovals(journal: ReturnType<typeof makeEngine>["journal"], n: number, onFailure?: (tries: number) => void): { tries: number } {
    const seen = { tries: 0 };
    const remove = journal.remove.bind(journal);
    journal.remove = async (id) => {
      seen.tries++;
      if (n-- > 0) {
        onFailure?.(seen.tries);
        throw new Error("journal timeout (scripted)");
      }
      return remove(id);
    };
    return seen;
  }

  it("is retried with capped backoff until the entry is gone", async () => {
    const { engine, journal, clock } = makeEngine(root);
    const removals = failRemovals(journal, 3);
    const t0 = clock.now();
    await engine.checkpoint({ checkpoint_id: "rm-1", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    expect(removals.tries).toBe(4);
    expect(clock.now() - t0).toBe(100 + 200 + 400); // the pauses between tries
  });

  it("its pauses are jittered (equal jitter, from the clock's random source), so retries do not run in step", async () => {
    const { engine, journal, clock } = makeEngine(root);
    clock.random = () => 0; // the bottom of each draw: half the grown pause
    const removals = failRemovals(journal, 3);
    const t0 = clock.now();
    await engine.checkpoint({ checkpoint_id: "rm-j", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    expect(removals.tries).toBe(4);
    expect(clock.now() - t0).toBe(50 + 100 + 200);
  });

  it("of a restore's resume: the resume answers only once the entry is gone, so no successor can find it resuming", async () => {
    const { engine, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "rm-2", episode_ids: null, stop: true, controller_state: null });
    await engine.restore({ checkpoint_id: "rm-2", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(journal.entries.get("rm-2")?.state).toBe("restored"); // the checkpoint's own removal yields to it
    const removals = failRemovals(journal, 2);
    await engine.resume({ checkpoint_id: "rm-2" });
    expect(journal.entries.has("rm-2")).toBe(false);
    expect(removals.tries).toBe(3);
  });

  it("of a restore's resume, failing until leadership is lost: outcome_unknown, and the entry stays resuming for the successor to finish", async () => {
    const { engine, journal, fake } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "rm-3", episode_ids: null, stop: true, controller_state: null });
    await engine.restore({ checkpoint_id: "rm-3", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    failRemovals(journal, Infinity, (tries) => tries === 2 && engine.leadershipLost());
    const refused = await refusalOf(engine.resume({ checkpoint_id: "rm-3" }));
    expect(refused.code).toBe("outcome_unknown");
    expect(fake.ops("resume")).toHaveLength(5); // every participant resumed
    expect(journal.entries.get("rm-3")?.state).toBe("resuming");
  });

  it("of a restore's resume that failed at a participant: answered only once the entry is gone too, else outcome_unknown (a successor finding it resuming may clean up)", async () => {
    const { engine, journal, fake } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "rm-4", episode_ids: null, stop: true, controller_state: null });
    await engine.restore({ checkpoint_id: "rm-4", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    fake.set("agent", "a1", "resume", "unreachable");
    failRemovals(journal, Infinity, (tries) => tries === 2 && engine.leadershipLost());
    const refused = await refusalOf(engine.resume({ checkpoint_id: "rm-4" }));
    // Not the participants' failure ("resume failed on …: the checkpoint is closed anyway"): a
    // controller told so continues the restored rollouts, which a successor finding the entry
    // `resuming` would retire once a restorer's restart shows in its view (a likely one here).
    expect(journal.entries.get("rm-4")?.state).toBe("resuming");
    expect(refused.code).toBe("outcome_unknown");
  });

  it("of a restore's resume that failed at a participant, the entry removed: that participant's failure, after the removal; the retry resumes it there", async () => {
    let releaseRemoval!: () => void;
    const removalHeld = new Promise<void>((resolve) => (releaseRemoval = resolve));
    let removalReached!: () => void;
    const reached = new Promise<void>((resolve) => (removalReached = resolve));
    const { engine, journal, fake } = makeEngine(root, {
      hooks: {
        beforeJournalRemove: async (id) => {
          if (id !== "rm-5" || journal.entries.get(id)?.state !== "resuming") return;
          removalReached();
          await removalHeld;
        },
      },
    });
    await engine.checkpoint({ checkpoint_id: "rm-5", episode_ids: null, stop: true, controller_state: null });
    await engine.restore({ checkpoint_id: "rm-5", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    fake.set("agent", "a1", "resume", "unreachable");
    let answered = false;
    const answer = refusalOf(engine.resume({ checkpoint_id: "rm-5" })).finally(() => (answered = true));
    await reached;
    await new Promise((resolve) => setImmediate(resolve)); // every microtask the answer could take has run
    expect(answered).toBe(false); // not before the entry is gone
    releaseRemoval();
    expect((await answer).code).toBe("unreachable");
    expect(journal.entries.has("rm-5")).toBe(false);
    fake.script.clear();
    const sent = fake.ops("resume").length;
    await engine.resume({ checkpoint_id: "rm-5" });
    expect(fake.ops("resume").slice(sent).map((c) => `${c.kind}/${c.instance}`)).toEqual(["agent/a1"]);
  });
});

describe("recovery of a decided checkpoint overtaken by a newer publication", () => {
  it("is resumed (presumed abort), never completed: LATEST is not moved back", async () => {
    const first = makeEngine(root);
    await first.engine.prepare({ checkpoint_id: "old-dec" });
    await first.engine.commit({ checkpoint_id: "old-dec", episode_ids: null, stop: false });
    // Its withdrawal failed (the entry stayed decided) and the controller moved on.
    const entry = structuredClone(first.journal.entries.get("old-dec")!);
    expect(entry.state).toBe("decided");
    await first.engine.resume({ checkpoint_id: "old-dec" });
    first.clock.current += 1000;
    await first.engine.checkpoint({ checkpoint_id: "new-pub", episode_ids: null, stop: false, controller_state: null });
    await first.writer.settled();
    const second = await successor(entry);
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "old-dec", action: "decision_overtaken_resumed" }]);
    expect(second.fake.ops("commit")).toHaveLength(0);
    expect(second.fake.ops("resume").map((c) => c.body.checkpoint_id)).toEqual(Array(5).fill("old-dec"));
    expect(await new CheckpointCatalog(root).latest()).toBe("new-pub");
    await expect(new CheckpointCatalog(root).get("old-dec")).rejects.toMatchObject({ code: "not_found" });
    await journalEmptied(second.journal);
  });
});

describe("recovery of a decided checkpoint while LATEST cannot be read", () => {
  it("completes nothing (a newer publication may be behind the storage's refusal): the entry stays journaled, failed, for a later recovery", async () => {
    const first = makeEngine(root);
    await first.engine.prepare({ checkpoint_id: "dec-eio" });
    await first.engine.commit({ checkpoint_id: "dec-eio", episode_ids: null, stop: false });
    const entry = structuredClone(first.journal.entries.get("dec-eio")!);
    await first.engine.resume({ checkpoint_id: "dec-eio" });
    first.clock.current += 1000;
    await first.engine.checkpoint({ checkpoint_id: "new-pub2", episode_ids: null, stop: false, controller_state: null });
    await first.writer.settled();
    const second = await successor(entry);
    second.catalog.latest = async () => {
      throw Object.assign(new Error(`EIO: i/o error, open '${join(root, "LATEST")}'`), { code: "EIO", syscall: "open" });
    };
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "dec-eio", action: "failed" }]);
    expect(second.fake.ops("commit")).toHaveLength(0);
    expect(second.journal.entries.get("dec-eio")?.state).toBe("decided");
    expect(await new CheckpointCatalog(root).latest()).toBe("new-pub2");
  });
});

/** Every entry `journal` records from now on, as written (the journal keeps only the latest). */
function recordedEntries(journal: ReturnType<typeof makeEngine>["journal"]): JournalEntry[] {
  const recorded: JournalEntry[] = [];
  const record = journal.record.bind(journal);
  journal.record = async (entry) => {
    recorded.push(structuredClone(entry));
    return record(entry);
  };
  return recorded;
}

describe("recovery of a restore whose resume was under way", () => {
  it("finishes it as a success: the controller's retried resume answers ok, nothing is retired", async () => {
    const first = makeEngine(root);
    await first.engine.checkpoint({ checkpoint_id: "rr", episode_ids: null, stop: false, controller_state: null });
    await first.engine.restore({ checkpoint_id: "rr", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    // What the journal held when the leader died: the last entry it wrote before the resume's replies.
    const recorded = recordedEntries(first.journal);
    await first.engine.resume({ checkpoint_id: "rr" }); // reaches every participant
    await first.writer.settled();
    const entry = recorded.at(-1)!;
    expect(entry.state).toBe("resuming");
    const second = await successor(entry);
    for (const [k, v] of first.fake.state) second.fake.state.set(k, v); // everyone idle: resumed
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rr", action: "resumed" }]);
    expect(await second.engine.resume({ checkpoint_id: "rr" })).toMatchObject({ checkpoint_id: "rr" });
    expect(second.fake.ops("retire")).toHaveLength(0);
    await journalEmptied(second.journal);
  });
});

describe("recovery of a restore whose resume was under way, a restorer restarted meanwhile", () => {
  it("addresses the resume to the journaled restorers: the restarted one refuses, so the clean-up runs and the retried resume answers restore_failed", async () => {
    const first = makeEngine(root);
    await first.engine.checkpoint({ checkpoint_id: "rz", episode_ids: null, stop: false, controller_state: null });
    for (const m of first.fake.members) first.fake.restorers.set(`${m.kind}.${m.instance}`, `restorer-${m.instance}`);
    await first.engine.restore({ checkpoint_id: "rz", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    const recorded = recordedEntries(first.journal);
    await first.engine.resume({ checkpoint_id: "rz" });
    await first.writer.settled();
    const entry = recorded.find((e) => e.state === "resuming")!;
    expect(entry.incarnations?.["environment.e1"]).toBe("restorer-e1");
    const second = await successor(entry);
    for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "restored", checkpoint_id: "rz" });
    // e1 restarted (the leader and one Gym process died together): the new process refuses what is
    // addressed to the one that restored, and would accept an unaddressed resume as a no-op.
    const request = second.fake.request.bind(second.fake);
    second.fake.request = async (subject, body, options) => {
      const parsed = JSON.parse(body) as { incarnation?: string };
      if (subject.endsWith(".environment.e1.resume") && parsed.incarnation === "restorer-e1") {
        return JSON.stringify({ error: { code: "stale_incarnation", detail: "addressed to restorer-e1; this process is fresh-e1" } });
      }
      return request(subject, body, options);
    };
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rz", action: "retired_resumed" }]);
    expect(second.fake.ops("retire")).toHaveLength(5);
    const retried = await refusalOf(second.engine.resume({ checkpoint_id: "rz" }));
    expect(retried.code).toBe("restore_failed");
  });
});

describe("recovery of a restore whose resume was under way, a restorer's restart shown in the successor's view", () => {
  it("is taken for a restart although the new process does not answer: the clean-up runs and the retried resume answers restore_failed", async () => {
    const first = makeEngine(root);
    await first.engine.checkpoint({ checkpoint_id: "rv", episode_ids: null, stop: false, controller_state: null });
    for (const m of first.fake.members) first.fake.restorers.set(`${m.kind}.${m.instance}`, `restorer-${m.instance}`);
    await first.engine.restore({ checkpoint_id: "rv", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    const recorded = recordedEntries(first.journal);
    await first.engine.resume({ checkpoint_id: "rv" });
    await first.writer.settled();
    const entry = recorded.find((e) => e.state === "resuming")!;
    // e1's restorer died; the process that replaced it announced itself (the successor's view shows
    // it) but takes no requests yet (it crashed again, or has not subscribed): no responders.
    const second = makeEngine(root, { incarnations: new Map([["environment.e1", "fresh-e1"]]) });
    await second.journal.record(entry);
    for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "restored", checkpoint_id: "rv" });
    second.fake.set("environment", "e1", "resume", "unreachable");
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rv", action: "retired_resumed" }]);
    expect(second.fake.ops("retire").length).toBeGreaterThan(0);
    const retried = await refusalOf(second.engine.resume({ checkpoint_id: "rv" }));
    expect(retried.code).toBe("restore_failed");
  });
});

describe("recovery of a decided checkpoint: publications of other coordinators are ordered by epoch, not their clocks", () => {
  it("a newer leader's decision is completed although LATEST's older checkpoint came from a clock running ahead", async () => {
    const fast = makeEngine(root);
    fast.clock.current += 5000;
    await fast.engine.checkpoint({ checkpoint_id: "w-old", episode_ids: null, stop: false, controller_state: null });
    await fast.writer.settled();
    const crash = new Error("crash after the decision");
    const next = makeEngine(root, { hooks: { afterDecision: () => Promise.reject(crash) } });
    (next.leadership as unknown as { fixedEpoch: number }).fixedEpoch = 8;
    await next.engine.prepare({ checkpoint_id: "x-new" });
    await expect(next.engine.commit({ checkpoint_id: "x-new", episode_ids: null, stop: false })).rejects.toBe(crash);
    const entry = structuredClone(next.journal.entries.get("x-new")!);
    expect(entry.epoch).toBe(8);
    const third = await successor({ ...entry, auto_publish: true });
    (third.leadership as unknown as { fixedEpoch: number }).fixedEpoch = 9;
    expect(await third.engine.recover()).toEqual([{ checkpoint_id: "x-new", action: "committed_published_resumed" }]);
    expect(await new CheckpointCatalog(root).latest()).toBe("x-new");
  });
});

describe("recovery of a restore a predecessor journaled", () => {
  const scope = [{ rollout_id: "r1", attempt: 0 }];

  /**
   * A predecessor that restored `id` everywhere (each participant caching its reply, as real ones
   * do) and died before the controller got the reply: its entry, and the successor over the same
   * participant processes. `state`: what the entry says (restoring: it died before journaling restored).
   */
  async function restoredThenCrashed(id: string, state: "restoring" | "restored") {
    const first = makeEngine(root);
    await first.engine.checkpoint({ checkpoint_id: id, episode_ids: null, stop: false, controller_state: null });
    for (const m of first.fake.members) first.fake.restorers.set(`${m.kind}.${m.instance}`, `inc-${m.instance}`);
    const reply = await first.engine.restore({ checkpoint_id: id, episode_ids: scope });
    const entry = structuredClone(first.journal.entries.get(id)!);
    expect(entry.state).toBe("restored");
    await first.writer.settled();
    const second = await successor({ ...entry, state });
    for (const [key, held] of first.fake.state) second.fake.state.set(key, held);
    for (const [key, cached] of first.fake.restoredHere) second.fake.restoredHere.set(key, cached);
    for (const [key, incarnation] of first.fake.restorers) second.fake.restorers.set(key, incarnation);
    return { second, reply };
  }

  it("restoring, every participant restored: re-sent, answered from their caches, recovered as restored; the retry gets the reply and the resume works", async () => {
    const { second, reply } = await restoredThenCrashed("rs1", "restoring");
    // One participant never got the predecessor's restore: it installs it now.
    second.fake.restoredHere.delete("model.m1.rs1");
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rs1", action: "restored" }]);
    expect(second.fake.ops("restore")).toHaveLength(5);
    expect(second.fake.ops("restore").every((c) => c.body.checkpoint_dir === second.catalog.dirFor("rs1"))).toBe(true);
    expect(second.fake.installs).toEqual(["model/m1"]);
    expect(second.fake.ops("retire")).toHaveLength(0);
    expect(second.fake.ops("resume")).toHaveLength(0);
    expect(second.journal.entries.get("rs1")?.state).toBe("restored");
    expect(second.engine.openCheckpoint).toMatchObject({ checkpoint_id: "rs1", phase: "restored" });
    // The controller saw outcome_unknown; its retry with the same id and scope gets the reply.
    expect(await second.engine.restore({ checkpoint_id: "rs1", episode_ids: scope })).toEqual(reply);
    expect(second.fake.ops("restore")).toHaveLength(5);
    // The resume goes to the processes that restored (their replies named them).
    expect((await second.engine.resume({ checkpoint_id: "rs1" })).participants).toHaveLength(5);
    expect(second.fake.ops("resume").map((c) => c.body.incarnation).sort()).toEqual(["inc-a1", "inc-a2", "inc-e1", "inc-m1", "inc-r1"]);
    expect(second.engine.openCheckpoint).toBeNull();
  });

  it("restoring, one participant refuses: the clean-up retires attempt+1 where it may have been installed and resumes everyone", async () => {
    const { second } = await restoredThenCrashed("rs2", "restoring");
    // m1 holds live state (a refusal changes nothing, and it never installed this restore); a1
    // refuses it as resumed: it may have installed it and resumed by its lease since.
    second.fake.restoredHere.delete("model.m1.rs2");
    second.fake.set("model", "m1", "restore", { error: "invalid_checkpoint_state" });
    second.fake.set("agent", "a1", "restore", { error: "stale_checkpoint" });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rs2", action: "retired_resumed" }]);
    expect(second.fake.ops("retire").map((c) => `${c.kind}/${c.instance}`).sort()).toEqual(["agent/a1", "agent/a2", "environment/e1", "resources/r1"]);
    expect(second.fake.ops("retire")[0]!.body.episode_ids).toEqual([{ rollout_id: "r1", attempt: 1 }]);
    expect(second.fake.ops("resume")).toHaveLength(5);
    expect(second.engine.openCheckpoint).toBeNull();
    await journalEmptied(second.journal);
  });

  it.each(["restoring", "restored"] as const)("%s, a participant manifest replaced since publication: nothing re-sent; cleaned up at every member (invalid_checkpoint_state), as a restore refuses it", async (state) => {
    const { second } = await restoredThenCrashed(`rs-m-${state}`, state);
    const path = join(second.catalog.dirFor(`rs-m-${state}`), "gym", "agent", "a1", "manifest.json");
    const replaced = JSON.parse(await readFile(path, "utf8")) as { created_at: number };
    replaced.created_at += 1; // valid on its own: only checkpoint.json's digest tells
    await writeFile(path, `${JSON.stringify(replaced, null, 2)}\n`);
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: `rs-m-${state}`, action: "retired_resumed" }]);
    expect(second.fake.ops("restore")).toHaveLength(0);
    // The predecessor's restore may have installed it anywhere: attempt+1 retired at every member.
    const events = second.fake.events;
    expect(events.indexOf("journal:restore_cleanup")).toBeLessThan(events.findIndex((e) => e.startsWith("retire:")));
    expect(second.fake.ops("retire")).toHaveLength(5);
    expect(second.fake.ops("resume")).toHaveLength(5);
    expect(second.engine.openCheckpoint).toBeNull();
    await journalEmptied(second.journal);
    // The controller's retry is refused before anything is sent. This view shows none of the
    // processes, so it is a new restore (docs/api.md): checkpoint.json's check refuses it. A view
    // showing the processes the clean-up resumed answers the clean-up's restore_failed instead.
    const sent = second.fake.calls.length;
    expect((await refusalOf(second.engine.restore({ checkpoint_id: `rs-m-${state}`, episode_ids: scope }))).code).toBe("invalid_checkpoint_state");
    expect(second.fake.calls.length).toBe(sent);
  });

  it("restored: re-sent to rebuild the reply, which the retry gets; the resume works", async () => {
    const { second, reply } = await restoredThenCrashed("rs3", "restored");
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rs3", action: "restored" }]);
    expect(second.fake.installs).toEqual([]);
    expect(await second.engine.restore({ checkpoint_id: "rs3", episode_ids: scope })).toEqual(reply);
    // Another scope is another question: refused, the open restore kept.
    expect((await refusalOf(second.engine.restore({ checkpoint_id: "rs3", episode_ids: [] }))).code).toBe("invalid_phase");
    expect((await second.engine.resume({ checkpoint_id: "rs3" })).participants).toHaveLength(5);
    expect(second.fake.ops("retire")).toHaveLength(0);
  });

  it("restored, its controller's resume cut short by the crash: nothing is retired; the resume's retry finishes it", async () => {
    const { second } = await restoredThenCrashed("rs4", "restored");
    second.fake.set("agent", "a1", "restore", { error: "stale_checkpoint" }); // resumed already (its reply cache went with it)
    second.fake.state.set("agent.a1", { phase: "idle", checkpoint_id: null });
    second.fake.restoredHere.delete("agent.a1.rs4");
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rs4", action: "restored_partly_resumed" }]);
    expect(second.fake.ops("retire")).toHaveLength(0);
    expect(second.fake.ops("resume")).toHaveLength(0);
    expect(second.engine.openCheckpoint).toMatchObject({ checkpoint_id: "rs4", phase: "restored" });
    expect((await second.engine.resume({ checkpoint_id: "rs4" })).participants).toHaveLength(5);
    expect(second.fake.ops("retire")).toHaveLength(0);
  });

  it("restored and resumed everywhere (its entry outlived the close): closed without a message", async () => {
    const { second } = await restoredThenCrashed("rs5", "restored");
    for (const m of second.fake.members) second.fake.state.set(`${m.kind}.${m.instance}`, { phase: "idle", checkpoint_id: null });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rs5", action: "restored_closed" }]);
    expect(second.fake.ops("restore")).toHaveLength(0);
    expect(second.fake.ops("retire")).toHaveLength(0);
    expect(second.fake.ops("resume")).toHaveLength(0);
    expect(second.engine.openCheckpoint).toBeNull();
    await journalEmptied(second.journal);
  });

  it("restored, one participant lost it (restarted, holding live state): journaled restore_cleanup, then attempt+1 retired everywhere and everyone resumed", async () => {
    const { second } = await restoredThenCrashed("rs6", "restored");
    second.fake.restoredHere.delete("model.m1.rs6");
    second.fake.state.set("model.m1", { phase: "idle", checkpoint_id: null });
    second.fake.set("model", "m1", "restore", { error: "invalid_checkpoint_state" });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rs6", action: "retired_resumed" }]);
    // Journaled first: a successor finishes the clean-up rather than re-drive the restore.
    const events = second.fake.events;
    expect(events.indexOf("journal:restore_cleanup")).toBeGreaterThan(-1);
    expect(events.indexOf("journal:restore_cleanup")).toBeLessThan(events.findIndex((e) => e.startsWith("retire:")));
    expect(second.fake.ops("retire")).toHaveLength(5);
    expect(second.fake.ops("resume")).toHaveLength(5);
    expect(second.engine.openCheckpoint).toBeNull();
  });

  /** Every participant process restarts: fresh, idle, holding nothing (no restore replies kept). */
  function restartAll(fake: FakeParticipants): void {
    for (const m of fake.members) fake.state.set(`${m.kind}.${m.instance}`, { phase: "idle", checkpoint_id: null });
    fake.restoredHere.clear();
  }

  it("re-driven, then abandoned by its controller: once every participant restarted, the next prepare closes it without a message and goes ahead", async () => {
    const { second } = await restoredThenCrashed("rs7", "restoring");
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rs7", action: "restored" }]);
    // Its controller took outcome_unknown for a failure: it retires the sources and moves on, never resuming rs7.
    await second.engine.retire({ episode_ids: scope });
    restartAll(second.fake);
    second.fake.calls.length = 0;
    expect((await second.engine.prepare({ checkpoint_id: "rs7-next" })).prepared).toBe(true);
    // Closed without a resume (it would fence rs7 in processes that never took part).
    expect(second.fake.calls.filter((c) => c.body.checkpoint_id === "rs7")).toEqual([]);
    expect(second.engine.openCheckpoint).toMatchObject({ checkpoint_id: "rs7-next", phase: "prepared" });
    await waitUntil(() => !second.journal.entries.has("rs7"), "rs7's journal entry removed", 5000);
  });

  it("re-driven and abandoned, every participant restarted: a retire goes outside any checkpoint, and a restore of it installs it afresh", async () => {
    const { second, reply } = await restoredThenCrashed("rs8", "restoring");
    await second.engine.recover();
    restartAll(second.fake);
    // Same id and scope: not the stale reply of a restore nobody holds any more.
    expect(await second.engine.restore({ checkpoint_id: "rs8", episode_ids: scope })).toEqual(reply);
    expect(second.fake.installs).toHaveLength(5);
    await second.engine.resume({ checkpoint_id: "rs8" });
    restartAll(second.fake);
    await second.engine.restore({ checkpoint_id: "rs8", episode_ids: scope });
    restartAll(second.fake);
    second.fake.calls.length = 0;
    await second.engine.retire({ episode_ids: [{ rollout_id: "r1", attempt: 2 }] });
    expect(second.fake.ops("retire").map((c) => c.body.checkpoint_id)).toEqual(Array(5).fill("retire"));
    expect(second.engine.openCheckpoint).toBeNull();
  });

  it("restored, every participant restarted since: closed without a message, nothing installed into the fresh processes; the next prepare goes ahead", async () => {
    const { second } = await restoredThenCrashed("rs9", "restored");
    restartAll(second.fake);
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rs9", action: "restored_closed" }]);
    expect(second.fake.calls.filter((c) => c.op !== "status")).toEqual([]);
    expect(second.engine.openCheckpoint).toBeNull();
    // its controller, told outcome_unknown, retries the resume: nothing it restored is left
    const retried = await refusalOf(second.engine.resume({ checkpoint_id: "rs9" }));
    expect(retried.code).toBe("restore_failed");
    expect(retried.message).toContain("released before its resume");
    expect((await second.engine.prepare({ checkpoint_id: "rs9-next" })).prepared).toBe(true);
    await waitUntil(() => !second.journal.entries.has("rs9"), "rs9's journal entry removed", 5000);
  });

  it("restored, one participant not answering its status (it may hold it): re-driven as before", async () => {
    const { second } = await restoredThenCrashed("rs10", "restored");
    restartAll(second.fake);
    second.fake.set("model", "m1", "status", "unreachable");
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rs10", action: "restored" }]);
    expect(second.fake.ops("restore")).toHaveLength(5);
  });

  /** Makes the leader `engine` die (demoted) once the first retire stage's request was answered. */
  function dieAfterFirstRetire(made: ReturnType<typeof makeEngine>): void {
    const request = made.fake.request.bind(made.fake);
    made.fake.request = async (subject, body, options) => {
      const answer = await request(subject, body, options);
      if (subject.endsWith(".retire")) {
        made.leadership.demote();
        made.engine.leadershipLost();
      }
      return answer;
    };
  }

  it("a restored resume's clean-up cut short by a crash (e1 retired attempt+1): the successor finishes it, never re-drives the restore, and the resume's retry answers restore_failed", async () => {
    const incarnations = new Map(FOUR_KINDS.map((m) => [`${m.kind}.${m.instance}`, "old"]));
    const first = makeEngine(root, { incarnations });
    await first.engine.checkpoint({ checkpoint_id: "rc1", episode_ids: null, stop: false, controller_state: null });
    await first.engine.restore({ checkpoint_id: "rc1", episode_ids: scope });
    incarnations.set("model.m1", "new"); // m1 restarted between the restore and its resume
    dieAfterFirstRetire(first);
    expect((await refusalOf(first.engine.resume({ checkpoint_id: "rc1" }))).code).toBe("outcome_unknown");
    expect(first.fake.ops("retire").map((c) => `${c.kind}/${c.instance}`)).toEqual(["environment/e1"]);
    const entry = structuredClone(first.journal.entries.get("rc1")!);
    expect(entry.state).toBe("restore_cleanup");

    // The successor over the same processes: m1 is the fresh one, the others still hold rc1 and keep their restore replies.
    const second = await successor(entry);
    for (const [key, held] of first.fake.state) second.fake.state.set(key, held);
    for (const [key, cached] of first.fake.restoredHere) second.fake.restoredHere.set(key, cached);
    second.fake.state.set("model.m1", { phase: "idle", checkpoint_id: null });
    second.fake.restoredHere.delete("model.m1.rc1");
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rc1", action: "retired_resumed" }]);
    expect(second.fake.ops("restore")).toHaveLength(0);
    expect(second.fake.ops("retire").map((c) => `${c.kind}/${c.instance}`).sort()).toEqual(FOUR_KINDS.map((m) => `${m.kind}/${m.instance}`).sort());
    expect(second.fake.ops("retire").every((c) => JSON.stringify(c.body.episode_ids) === JSON.stringify([{ rollout_id: "r1", attempt: 1 }]))).toBe(true);
    expect(second.fake.ops("resume")).toHaveLength(5);
    expect(second.engine.openCheckpoint).toBeNull();
    // The controller retries its resume (it got outcome_unknown): the restore failed, all or nothing.
    expect((await refusalOf(second.engine.resume({ checkpoint_id: "rc1" }))).code).toBe("restore_failed");
    await journalEmptied(second.journal);
  });

  it("a failed restore's clean-up cut short by a crash: the successor finishes it at the same participants (not the one that refused), never re-drives the restore", async () => {
    const first = makeEngine(root);
    await first.engine.checkpoint({ checkpoint_id: "rc2", episode_ids: null, stop: false, controller_state: null });
    first.fake.set("model", "m1", "restore", { error: "invalid_checkpoint_state" }); // installed nothing
    dieAfterFirstRetire(first);
    expect((await refusalOf(first.engine.restore({ checkpoint_id: "rc2", episode_ids: scope }))).code).toBe("outcome_unknown");
    const entry = structuredClone(first.journal.entries.get("rc2")!);
    expect(entry.state).toBe("restore_cleanup");
    expect(entry.retire_at?.map((m) => m.instance).sort()).toEqual(["a1", "a2", "e1", "r1"]);

    // m1 would restore now (its refusal was passing): a re-driven restore would look restored everywhere.
    const second = await successor(entry);
    for (const [key, held] of first.fake.state) second.fake.state.set(key, held);
    for (const [key, cached] of first.fake.restoredHere) second.fake.restoredHere.set(key, cached);
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "rc2", action: "retired_resumed" }]);
    expect(second.fake.ops("restore")).toHaveLength(0);
    expect(second.fake.ops("retire").map((c) => `${c.kind}/${c.instance}`).sort()).toEqual(["agent/a1", "agent/a2", "environment/e1", "resources/r1"]);
    expect(second.fake.ops("resume")).toHaveLength(5);
    expect(second.engine.openCheckpoint).toBeNull();
    await journalEmptied(second.journal);
  });

  it.each(["manifest", "participant"] as const)(
    "a re-driven restore that failed (%s), its clean-up cut short by a crash: the successor that finishes it answers the controller's retried restore restore_failed, nothing sent, while the same processes serve",
    async (cause) => {
      const id = `rf-${cause}`;
      const incarnations = new Map(FOUR_KINDS.map((m) => [`${m.kind}.${m.instance}`, "old"]));
      /** A coordinator over the same root and processes, taking over `entry`. */
      const takeOver = async (entry: JournalEntry, from: ReturnType<typeof makeEngine>) => {
        const next = makeEngine(root, { incarnations });
        await next.journal.record(entry);
        for (const [key, held] of from.fake.state) next.fake.state.set(key, held);
        for (const [key, cached] of from.fake.restoredHere) next.fake.restoredHere.set(key, cached);
        return next;
      };
      // The restore's leader died before its reply (the controller got outcome_unknown): journaled restoring.
      const first = makeEngine(root, { incarnations });
      await first.engine.checkpoint({ checkpoint_id: id, episode_ids: null, stop: false, controller_state: null });
      await first.engine.restore({ checkpoint_id: id, episode_ids: scope });
      await first.writer.settled();
      // Its successor's re-drive fails; the successor dies after the clean-up's first retire.
      const second = await takeOver({ ...structuredClone(first.journal.entries.get(id)!), state: "restoring" }, first);
      if (cause === "manifest") {
        const path = join(second.catalog.dirFor(id), "gym", "agent", "a1", "manifest.json");
        const replaced = JSON.parse(await readFile(path, "utf8")) as { created_at: number };
        replaced.created_at += 1;
        await writeFile(path, `${JSON.stringify(replaced, null, 2)}\n`);
      } else {
        // m1 lost what it restored (its reply cache too) and fails the install now.
        second.fake.restoredHere.delete(`model.m1.${id}`);
        second.fake.set("model", "m1", "restore", { error: "internal_error" });
      }
      dieAfterFirstRetire(second);
      await second.engine.recover().catch(() => undefined);
      const cleanup = structuredClone(second.journal.entries.get(id)!);
      expect(cleanup.state).toBe("restore_cleanup");

      // The next leader finishes the clean-up (attempt+1 retired, everyone resumed).
      const third = await takeOver(cleanup, second);
      expect(await third.engine.recover()).toEqual([{ checkpoint_id: id, action: "retired_resumed" }]);
      expect(third.fake.ops("resume")).toHaveLength(5);
      // The controller retries its restore: the same processes fenced the id, so it gets the
      // clean-up's restore_failed (restart from input), not a new restore's refusal or failure.
      const sent = third.fake.calls.length;
      const retried = await refusalOf(third.engine.restore({ checkpoint_id: id, episode_ids: scope }));
      expect(retried.code).toBe("restore_failed");
      expect(retried.message).toContain("attempt+1 was retired where the restore may have installed it");
      expect(third.fake.calls.length).toBe(sent);
      await journalEmptied(third.journal);
    },
  );
});

/**
 * docs/architecture.md "Restarted participants are left out of the open checkpoint": "A restore's
 * reply names the process that restored, and its resume goes to that one even while the view lags."
 * A participant restarted before the restore, its announcement not in the view yet; the restore
 * reaches the new process, which names itself; then a failover. Before the fix the successor took
 * the lagging view (the old process) for a restart since the restore: the resume skipped the
 * restorer, left it parked in the checkpoint, and answered restore_failed for a restore nobody lost.
 * Found by engine-model.test.ts (seed 72).
 */
describe("recovery of a restored checkpoint whose restorer the view did not show yet", () => {
  it("the successor's resume reaches the process that restored: everyone resumed, success", async () => {
    const view = new Map(FOUR_KINDS.map((m) => [`${m.kind}.${m.instance}`, `${m.instance}-0`]));
    const first = makeEngine(root, { incarnations: view });
    for (const [key, incarnation] of view) first.fake.incarnation.set(key, incarnation);
    await first.engine.checkpoint({ checkpoint_id: "lag", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(first.journal);
    const restarted = first.fake.restart("agent", "a1"); // the view still shows a1-0
    const sentBefore = first.fake.calls.length;
    const restored = await first.engine.restore({ checkpoint_id: "lag", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(restored.checkpoint_id).toBe("lag");
    first.engine.leadershipLost();
    first.leadership.demote();
    const second = makeEngine(root, { successorOf: { fake: first.fake, journal: first.journal, clock: first.clock }, epoch: 8, requireRecovery: true, incarnations: view });
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "lag", action: "restored" }]);
    await expect(second.engine.resume({ checkpoint_id: "lag" })).resolves.toMatchObject({ checkpoint_id: "lag" });
    expect(first.fake.calls.slice(sentBefore).filter((c) => c.op === "resume" && c.instance === "a1").map((c) => c.body.incarnation)).toEqual([restarted]);
    expect([...first.fake.state].filter(([, s]) => s.checkpoint_id === "lag")).toEqual([]);
  });
});

/**
 * The same, where the restorer is one the successor's re-driven restore installed: a participant
 * restarted twice after the restore, the view showing only the first restart (the second's
 * announcement not seen yet), while another member still held the restore, so recovery re-sent it
 * and the newest process installed it and named itself. Before the fix the resume took the
 * lagging view (neither the journaled restorer nor the new one) for a restart since the restore:
 * it skipped the new restorer, left it parked in the checkpoint, and answered restore_failed.
 * Found by engine-model.test.ts (ENGINE_MODEL_STEPS=400, seed 6489).
 */
describe("recovery re-sending a restore that a process newer than the view installs", () => {
  it("the resume reaches that process: everyone resumed, success", async () => {
    const view = new Map(FOUR_KINDS.map((m) => [`${m.kind}.${m.instance}`, `${m.instance}-0`]));
    const first = makeEngine(root, { incarnations: view });
    for (const [key, incarnation] of view) first.fake.incarnation.set(key, incarnation);
    await first.engine.checkpoint({ checkpoint_id: "lag2", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(first.journal);
    await first.engine.restore({ checkpoint_id: "lag2", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    first.membership.announce({ kind: "agent", instance: "a1" }, first.fake.restart("agent", "a1"));
    const newest = first.fake.restart("agent", "a1"); // the view still shows the one before it
    first.engine.leadershipLost();
    first.leadership.demote();
    const second = makeEngine(root, { successorOf: { fake: first.fake, journal: first.journal, clock: first.clock }, epoch: 8, requireRecovery: true, incarnations: view });
    const sentBefore = first.fake.calls.length;
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "lag2", action: "restored" }]);
    expect(first.fake.state.get("agent.a1")).toEqual({ phase: "restored", checkpoint_id: "lag2" });
    await expect(second.engine.resume({ checkpoint_id: "lag2" })).resolves.toMatchObject({ checkpoint_id: "lag2" });
    expect(first.fake.calls.slice(sentBefore).filter((c) => c.op === "resume" && c.instance === "a1").map((c) => c.body.incarnation)).toEqual([newest]);
    expect([...first.fake.state].filter(([, s]) => s.checkpoint_id === "lag2")).toEqual([]);
  });
});
