import { mkdir, mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";
import { connect, headers } from "@nats-io/transport-node";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { KvDecisionJournal, type JournalEntry } from "../../coordinator/ha/decision-journal.js";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { journalBucket } from "../../protocol/index.js";
import { journalEntry } from "../unit/coordinator/fake-participants.js";
import { startNats, type NatsFixture } from "../support/nats.js";
import { rawRequestWithHeaders } from "../support/raw-nats-request.js";
import { startStallProxy } from "../support/stall-proxy.js";

let nats: NatsFixture;
beforeAll(async () => {
  nats = await startNats();
});
afterAll(async () => {
  await nats?.close();
});

function capturingLogger(): { logger: pino.Logger; records: () => Record<string, unknown>[] } {
  const lines: string[] = [];
  const sink = new Writable({
    write(chunk: Buffer, _enc, done) {
      lines.push(chunk.toString());
      done();
    },
  });
  return { logger: pino({ level: "info" }, sink), records: () => lines.map((l) => JSON.parse(l) as Record<string, unknown>) };
}

describe("KV decision journal", () => {
  it("skips and logs a value that is not JSON or not an entry, and still lists the valid ones", async () => {
    const { logger, records } = capturingLogger();
    const journal = await KvDecisionJournal.open(nats.nc, "jbad", logger);
    const valid = journalEntry({ checkpoint_id: "c-ok", state: "open", participants: [{ kind: "environment", instance: "e1" }] });
    await journal.record(valid);
    // Values nothing in the coordinator wrote (an operator's `nats kv put`, a foreign tool).
    const kv = await new Kvm(nats.nc).open(journalBucket("jbad"));
    await kv.put("c-garbage", "not json {");
    await kv.put("c-foreign", JSON.stringify({ checkpoint_id: "c-foreign", state: "whatever" }));

    expect(await journal.list()).toEqual([valid]);
    const skipped = records().filter((r) => typeof r.msg === "string" && (r.msg as string).startsWith("journal_entry_"));
    expect(skipped.map((r) => [r.msg, r.key, r.module])).toEqual(
      expect.arrayContaining([
        ["journal_entry_not_json_skipped", "c-garbage", "journal"],
        ["journal_entry_invalid_skipped", "c-foreign", "journal"],
      ]),
    );
    expect(skipped).toHaveLength(2);
    // Skipped, not removed: an operator can still inspect them.
    expect((await kv.get("c-garbage"))?.string()).toBe("not json {");
  });
});

describe("KV decision journal: an entry under another checkpoint's key", () => {
  // Every entry is written under its own checkpoint id. One under another key (copied there by hand
  // or another tool) was acted on for the id it names, whose removal then purges that id's key, never
  // this one: every later recovery acted on it again (a restore_cleanup retiring attempt+1 each time).
  it("is skipped and logged, not recovered, and left in the bucket", async () => {
    const { logger, records } = capturingLogger();
    const journal = await KvDecisionJournal.open(nats.nc, "jkey", logger);
    const valid = journalEntry({ checkpoint_id: "c-own", state: "open", participants: [{ kind: "environment", instance: "e1" }] });
    await journal.record(valid);
    const kv = await new Kvm(nats.nc).open(journalBucket("jkey"));
    const elsewhere = journalEntry({ checkpoint_id: "c-named", state: "restore_cleanup", epoch: 9, participants: [{ kind: "environment", instance: "e1" }] });
    await kv.put("c-copied", JSON.stringify(elsewhere));

    expect(await journal.list()).toEqual([valid]);
    expect(await journal.highestEpoch()).toBe(valid.epoch);
    const skipped = records().filter((r) => r.msg === "journal_entry_other_key_skipped");
    // Logged at each read (the listing and the epoch floor's), as the other skipped values are.
    expect(skipped.map((r) => [r.key, r.checkpoint_id])).toEqual([["c-copied", "c-named"], ["c-copied", "c-named"]]);
    expect((await kv.get("c-copied"))?.operation).toBe("PUT");
  });
});

describe("KV decision journal: highest epoch (the lease's epoch floor)", () => {
  it("is the highest epoch a live entry carries, removed and foreign values left out, and reads nothing this coordinator writes against", async () => {
    const journal = await KvDecisionJournal.open(nats.nc, "jfloor");
    expect(await journal.highestEpoch()).toBe(0);
    const kept = journalEntry({ checkpoint_id: "c-kept", epoch: 7, state: "decided", participants: [] });
    await journal.record(kept);
    await journal.record(journalEntry({ checkpoint_id: "c-gone", epoch: 30, state: "open", participants: [] }));
    await journal.remove("c-gone");
    await (await new Kvm(nats.nc).open(journalBucket("jfloor"))).put("c-foreign", JSON.stringify({ epoch: 99 }));
    expect(await journal.highestEpoch()).toBe(7);
    // Its revision still known: the next write of the entry goes through.
    await journal.record({ ...kept, state: "published", updated_at: 2 });
    expect((await journal.list()).map((e) => e.state)).toEqual(["published"]);
  });
});

describe("KV decision journal: highest epoch, one entry no revision can pass", () => {
  it("an entry whose epoch no revision can pass (a hand-edited 2^53 - 1) is left out, logged, and does not hide the other entries' epochs", async () => {
    const { logger, records } = capturingLogger();
    const journal = await KvDecisionJournal.open(nats.nc, "jfloorrange", logger);
    await journal.record(journalEntry({ checkpoint_id: "c-real", epoch: 90, state: "decided", participants: [] }));
    const kv = await new Kvm(nats.nc).open(journalBucket("jfloorrange"));
    // A complete entry (it parses), its epoch edited by hand to the last safe integer.
    await kv.put("c-edited", JSON.stringify(journalEntry({ checkpoint_id: "c-edited", epoch: Number.MAX_SAFE_INTEGER, state: "decided", participants: [] })));
    // Before: 2^53 - 1, which highestEpochInUse counts as 0 whole: the new leader took a revision
    // below 90 and recovery re-drove c-real under an epoch its participants refuse (stale_epoch).
    expect(await journal.highestEpoch()).toBe(90);
    expect(records().filter((r) => r.msg === "journaled_epoch_out_of_range_ignored").map((r) => r.key)).toEqual(["c-edited"]);
  });
});

describe("KV decision journal: messages nats.js cannot read", () => {
  it("skips and logs an entry whose header block nats.js cannot decode, or whose key is no KV key (any client may publish them), and still lists the valid ones", async () => {
    const { logger, records } = capturingLogger();
    const journal = await KvDecisionJournal.open(nats.nc, "jhdr", logger);
    const valid = journalEntry({ checkpoint_id: "c-ok", state: "open", participants: [{ kind: "environment", instance: "e1" }] });
    await journal.record(valid);
    const bucket = journalBucket("jhdr");
    expect(await rawRequestWithHeaders(nats.server.url, `$KV.${bucket}.c-badheader`, "NATS/1.0\r\nbad name: x\r\n\r\n", "{}")).toContain('"seq"');
    await nats.nc.request(`$KV.${bucket}.c@odd`, "{}");

    expect(await journal.list()).toEqual([valid]);
    const skipped = records().filter((r) => r.msg === "journal_entry_unreadable_skipped");
    expect(skipped.map((r) => r.key).sort()).toEqual(["c-badheader", "c@odd"]);
    // The listing's compaction does not fail on them either, and the journal goes on.
    await journal.compactMarkers();
    expect(records().filter((r) => r.msg === "journal_marker_compaction_failed")).toEqual([]);
    await journal.remove("c-ok");
    expect(await journal.list()).toEqual([]);
  });
});

describe("KV decision journal: a restore's clean-up", () => {
  it("a restore_cleanup entry keeps where attempt+1 is retired; an entry without retire_at (written before it existed) still lists", async () => {
    const e1 = { kind: "environment" as const, instance: "e1" };
    const m1 = { kind: "model" as const, instance: "m1" };
    const journal = await KvDecisionJournal.open(nats.nc, "jclean");
    const cleanup = journalEntry({ checkpoint_id: "c-clean", state: "restore_cleanup", participants: [e1, m1], retire_at: [e1] });
    const older = journalEntry({ checkpoint_id: "c-older", state: "restoring", participants: [e1, m1], updated_at: 2 });
    await journal.record(cleanup);
    await journal.record(older);
    expect(await (await KvDecisionJournal.open(nats.nc, "jclean")).list()).toEqual([cleanup, older]);
  });
});

describe("KV decision journal: writes fenced by revision", () => {
  const entry = (checkpoint_id: string, state: JournalEntry["state"]) =>
    journalEntry({ checkpoint_id, state, participants: [{ kind: "environment", instance: "e1" }] });

  it("a deposed leader's late write cannot bring back an entry its successor removed or rewrote", async () => {
    const deposed = await KvDecisionJournal.open(nats.nc, "jcas");
    await deposed.record(entry("gone", "open"));
    await deposed.record(entry("moved", "decided"));
    // The successor recovers (reads every entry), aborts one and moves the other on.
    const successor = await KvDecisionJournal.open(nats.nc, "jcas");
    expect((await successor.list()).map((e) => e.checkpoint_id).sort()).toEqual(["gone", "moved"]);
    await successor.remove("gone");
    await successor.record(entry("moved", "restoring"));
    // The deposed leader's writes, in flight when it was cut off, land now: refused.
    await expect(deposed.record(entry("gone", "decided"))).rejects.toMatchObject({ code: "not_leader" });
    await expect(deposed.record(entry("moved", "restored"))).rejects.toMatchObject({ code: "not_leader" });
    await expect(deposed.remove("moved")).rejects.toMatchObject({ code: "not_leader" });
    expect((await successor.list()).map((e) => [e.checkpoint_id, e.state])).toEqual([["moved", "restoring"]]);
  });

  it("one coordinator's own writes of a key follow each other, also across a removal (a restore of a closed checkpoint)", async () => {
    const journal = await KvDecisionJournal.open(nats.nc, "jown");
    await journal.record(entry("c1", "open"));
    await journal.record(entry("c1", "decided"));
    // not awaited in between: queued per key, each against the revision the last one left
    await Promise.all([journal.remove("c1"), journal.record(entry("c1", "restoring")), journal.record(entry("c1", "restored"))]);
    expect((await journal.list()).map((e) => [e.checkpoint_id, e.state])).toEqual([["c1", "restored"]]);
    await journal.remove("c1");
    expect(await journal.list()).toEqual([]);
  });
});

describe("KV decision journal: a write whose acknowledgement was lost", () => {
  const entry = (checkpoint_id: string, state: "open" | "decided") => journalEntry({ checkpoint_id, state, participants: [{ kind: "environment", instance: "e1" }] });

  /** The next call of `method` lands at the server, then fails as a lost acknowledgement would. */
  function loseNextAck(journal: KvDecisionJournal, method: "create" | "update" | "purge"): void {
    const kv = (journal as unknown as { kv: Record<string, (...args: unknown[]) => Promise<unknown>> }).kv;
    const real = kv[method]!.bind(kv);
    let armed = true;
    kv[method] = async (...args: unknown[]) => {
      const result = await real(...args);
      if (armed) {
        armed = false;
        throw new Error("TIMEOUT");
      }
      return result;
    };
  }

  /**
   * The next call of `method` fails as a timeout before the server applied it; the write lands when
   * the returned function is called (the server applies it late, after the journal read the key back).
   * `asSent`: a create lands as the put the server got (expecting no message for the key), without
   * kv.create's client-side takeover of a purge marker.
   */
  function landNextLate(journal: KvDecisionJournal, method: "create" | "update", asSent = false): () => Promise<unknown> {
    const kv = (journal as unknown as { kv: Record<string, (...args: unknown[]) => Promise<unknown>> }).kv;
    const real = kv[method]!.bind(kv);
    let held: unknown[] | undefined;
    kv[method] = async (...args: unknown[]) => {
      if (held) return real(...args);
      held = args;
      throw new Error("TIMEOUT");
    };
    return () => (asSent ? kv.put!(held![0], held![1], { previousSeq: 0 }) : real(...held!));
  }

  it("does not fence out the coordinator whose write landed only after it read the key back: its next writes and the removal go through", async () => {
    for (const method of ["create", "update"] as const) {
      const journal = await KvDecisionJournal.open(nats.nc, `jlate-${method}`);
      if (method === "update") await journal.record(entry("ck", "open"));
      const land = landNextLate(journal, method);
      await expect(journal.record(entry("ck", method === "create" ? "open" : "decided"))).rejects.toThrow(/TIMEOUT/);
      await land();
      await journal.record(entry("ck", "decided"));
      await journal.remove("ck");
      expect(await (await KvDecisionJournal.open(nats.nc, `jlate-${method}`)).list()).toEqual([]);
    }
  });

  it("a removal after a create in doubt that landed late purges it; the id's next entry journals (a restore retried)", async () => {
    const restoring = (epoch: number) => journalEntry({ checkpoint_id: "ck", state: "restoring", epoch, participants: [{ kind: "environment", instance: "e1" }] });
    const journal = await KvDecisionJournal.open(nats.nc, "jlate-create-remove");
    const land = landNextLate(journal, "create");
    await expect(journal.record(restoring(1))).rejects.toThrow(/TIMEOUT/);
    await land();
    await journal.remove("ck");
    expect(await (await KvDecisionJournal.open(nats.nc, "jlate-create-remove")).list()).toEqual([]);
    await journal.record(restoring(2));
    expect((await (await KvDecisionJournal.open(nats.nc, "jlate-create-remove")).list()).map((e) => [e.state, e.epoch])).toEqual([["restoring", 2]]);
  });

  it("a removal after a create in doubt that has not landed fences it out: landing after the removal, it is refused", async () => {
    const journal = await KvDecisionJournal.open(nats.nc, "jlate-create-fenced");
    const land = landNextLate(journal, "create", true);
    await expect(journal.record(entry("ck", "open"))).rejects.toThrow(/TIMEOUT/);
    await journal.remove("ck");
    await expect(land()).rejects.toThrow(/wrong last sequence/);
    expect(await (await KvDecisionJournal.open(nats.nc, "jlate-create-fenced")).list()).toEqual([]);
    // The id journals again (the key's purge marker is taken over).
    await journal.record(entry("ck", "decided"));
    await journal.remove("ck");
    expect(await (await KvDecisionJournal.open(nats.nc, "jlate-create-fenced")).list()).toEqual([]);
  });

  it("a removal after a create in doubt that fails before it reached the server keeps the create in doubt: its retry purges the create landed since", async () => {
    const journal = await KvDecisionJournal.open(nats.nc, "jlate-create-retry");
    const land = landNextLate(journal, "create");
    await expect(journal.record(entry("ck", "open"))).rejects.toThrow(/TIMEOUT/);
    const internals = journal as unknown as { purgeAt: (...args: unknown[]) => Promise<void> };
    const purgeAt = internals.purgeAt;
    internals.purgeAt = async () => {
      internals.purgeAt = purgeAt;
      throw new Error("TIMEOUT");
    };
    await expect(journal.remove("ck")).rejects.toThrow(/TIMEOUT/);
    await land();
    await journal.remove("ck");
    expect(await (await KvDecisionJournal.open(nats.nc, "jlate-create-retry")).list()).toEqual([]);
  });

  it("still refuses (not_leader) a write after one in doubt when another coordinator wrote the key since", async () => {
    const journal = await KvDecisionJournal.open(nats.nc, "jlate-other");
    await journal.record(entry("ck", "open"));
    landNextLate(journal, "update");
    await expect(journal.record(entry("ck", "decided"))).rejects.toThrow(/TIMEOUT/);
    const successor = await KvDecisionJournal.open(nats.nc, "jlate-other");
    await successor.list();
    // Its own entry: its epoch (and time) differ from the write in doubt.
    await successor.record({ ...entry("ck", "decided"), epoch: 4 });
    await expect(journal.record(entry("ck", "open"))).rejects.toMatchObject({ code: "not_leader" });
    await expect(journal.remove("ck")).rejects.toMatchObject({ code: "not_leader" });
  });

  it("does not fence out the coordinator that wrote it: its next writes and the removal go through", async () => {
    for (const method of ["create", "update", "purge"] as const) {
      const journal = await KvDecisionJournal.open(nats.nc, `jack-${method}`);
      if (method !== "create") await journal.record(entry("ck", "open"));
      if (method === "purge") await journal.record(entry("ck", "decided"));
      loseNextAck(journal, method);
      const lost = method === "purge" ? journal.remove("ck") : journal.record(entry("ck", method === "create" ? "open" : "decided"));
      await expect(lost).rejects.toThrow(/TIMEOUT/);
      // landed: the coordinator carries on with the revision it left (a re-recorded entry after a removal)
      await journal.record(entry("ck", "open"));
      await journal.remove("ck");
      expect(await (await KvDecisionJournal.open(nats.nc, `jack-${method}`)).list()).toEqual([]);
    }
  });
});

describe("KV decision journal: a removal whose acknowledgement was lost, landed only after the read-back", () => {
  it("the removal's retry finds it landed (at the stream's leader) and succeeds, instead of refusing its own coordinator not_leader", async () => {
    const proxy = await startStallProxy(nats.server.port);
    const nc = await connect({ servers: proxy.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    try {
      // Each stalled request gives up after 1 s, not nats.js' 5 s: the test waits out two of them.
      const journal = await KvDecisionJournal.open(nc, "jpurge-late", undefined, undefined, undefined, 1_000);
      await journal.record(journalEntry({ checkpoint_id: "ck", state: "resuming", participants: [{ kind: "environment", instance: "e1" }] }));
      // The coordinator's connection stalls: its purge, then its read-back of the key, time out unanswered.
      proxy.stall();
      await expect(journal.remove("ck")).rejects.toThrow(/TIMEOUT/i);
      // The stall ends: the held purge lands now, after the read-back gave up.
      proxy.heal();
      await nc.flush();
      expect(await journal.remove("ck")).toBeUndefined();
      expect(await (await KvDecisionJournal.open(nats.nc, "jpurge-late")).list()).toEqual([]);
      // The key's fence still follows this coordinator: a restore of that id journals again.
      await journal.record(journalEntry({ checkpoint_id: "ck", state: "restoring", participants: [{ kind: "environment", instance: "e1" }] }));
      await journal.remove("ck");
    } finally {
      proxy.heal();
      await nc.close().catch(() => undefined);
      await proxy.close();
    }
  });
});

describe("KV decision journal: a replica that lags (an R3 bucket's direct get may be answered by any replica)", () => {
  const entry = (checkpoint_id: string, state: JournalEntry["state"]) => journalEntry({ checkpoint_id, state, participants: [{ kind: "environment", instance: "e1" }] });

  /** Every direct get this journal's connection sends is answered by a replica that has not yet received the key. */
  function lagReplica(journal: KvDecisionJournal): void {
    const direct = (journal as unknown as { kv: { jsm: { direct: { getMessage: () => Promise<null> } } } }).kv.jsm.direct;
    direct.getMessage = async () => null;
  }

  it("a successor's recovery listing reads each entry from the stream's leader: a decided checkpoint is not presumed aborted", async () => {
    const deposed = await KvDecisionJournal.open(nats.nc, "jlag-list");
    const decided = entry("ck", "decided");
    await deposed.record(decided);
    const successor = await KvDecisionJournal.open(nats.nc, "jlag-list");
    lagReplica(successor);
    expect(await successor.list()).toEqual([decided]);
    // and its revision is the current one: the successor's own writes are not refused not_leader
    await successor.record(entry("ck", "restoring"));
    await successor.remove("ck");
  });

  it("a removal that timed out before it landed is not taken for done because a lagging replica does not show the key", async () => {
    const journal = await KvDecisionJournal.open(nats.nc, "jlag-remove");
    await journal.record(entry("ck", "resuming"));
    lagReplica(journal);
    const kv = (journal as unknown as { kv: Record<string, (...args: unknown[]) => Promise<unknown>> }).kv;
    const purge = kv.purge!.bind(kv);
    kv.purge = async () => {
      kv.purge = purge;
      throw new Error("TIMEOUT"); // never reached the server
    };
    await expect(journal.remove("ck")).rejects.toThrow(/TIMEOUT/);
    await journal.remove("ck");
    expect(await (await KvDecisionJournal.open(nats.nc, "jlag-remove")).list()).toEqual([]);
  });
});

describe("KV decision journal: purge markers", () => {
  const messages = async (deployment: string) => (await (await jetstreamManager(nats.nc)).streams.info(`KV_${journalBucket(deployment)}`)).state.messages;
  const e1 = { kind: "environment" as const, instance: "e1" };

  it("drops the markers of removed entries once old enough, keeping live entries and a key written again after its removal", async () => {
    const journal = await KvDecisionJournal.open(nats.nc, "jmark", undefined, 0);
    for (const id of ["c1", "c2", "c3", "c4"]) await journal.record(journalEntry({ checkpoint_id: id, state: "open", participants: [e1] }));
    await journal.remove("c1");
    await journal.remove("c2");
    await journal.remove("c4");
    const again = journalEntry({ checkpoint_id: "c4", state: "restoring", participants: [e1] });
    await journal.record(again); // a restore of that id, after its entry was removed
    expect(await messages("jmark")).toBe(4); // two markers, c3, c4
    await journal.compactMarkers();
    expect(await messages("jmark")).toBe(2);
    expect((await journal.list()).map((e) => [e.checkpoint_id, e.state])).toEqual([
      ["c3", "open"],
      ["c4", "restoring"],
    ]);
    // The dropped keys can be journaled again, and what is left keeps its fence.
    await journal.record(journalEntry({ checkpoint_id: "c1", state: "open", participants: [e1] }));
    await journal.remove("c1");
    expect((await journal.list()).map((e) => e.checkpoint_id)).toEqual(["c3", "c4"]);
  });

  it("lists every live entry, without stalling, while its own compaction purges markers beside the listing", async () => {
    // The listing once ran an ordered consumer, which a filtered purge landing mid-delivery moved
    // past live keys: about one listing in four stalled for 30 s, and one came back empty.
    for (let round = 0; round < 20; round++) {
      const journal = await KvDecisionJournal.open(nats.nc, `jrace${round}`, undefined, 0);
      for (const id of ["c3", "c4", "c1"]) await journal.record(journalEntry({ checkpoint_id: id, state: "open", participants: [e1] }));
      await journal.remove("c1");
      expect((await journal.list()).map((e) => e.checkpoint_id)).toEqual(["c3", "c4"]);
      await journal.compactMarkers();
      expect(await messages(`jrace${round}`)).toBe(2);
    }
  });

  it("keeps markers younger than the keep period (by default 30 min): a compaction then drops nothing", async () => {
    const journal = await KvDecisionJournal.open(nats.nc, "jyoung");
    await journal.record(journalEntry({ checkpoint_id: "c1", state: "open", participants: [e1] }));
    await journal.remove("c1");
    await journal.compactMarkers();
    expect(await messages("jyoung")).toBe(1);
    // An empty bucket's compaction ends too.
    await (await KvDecisionJournal.open(nats.nc, "jempty", undefined, 0)).compactMarkers();
  });
});

/**
 * A restore's removal records how it settled (the purge marker's body), for a leader of a later
 * term answering that restore's retried resume (docs/api.md, resume): nothing durable recorded it
 * before, so a coordinator that led again answered from its memory of an earlier restore.
 */
describe("KV decision journal: a restore's outcome", () => {
  const e1 = { kind: "environment" as const, instance: "e1" };
  const messages = async (deployment: string) => (await (await jetstreamManager(nats.nc)).streams.info(`KV_${journalBucket(deployment)}`)).state.messages;

  it("is read back by another coordinator's journal after the removal; a plain removal, or an entry written since, has none", async () => {
    const a = await KvDecisionJournal.open(nats.nc, "joutcome");
    const b = await KvDecisionJournal.open(nats.nc, "joutcome");
    await a.record(journalEntry({ checkpoint_id: "c1", state: "restore_cleanup", participants: [e1] }));
    await a.remove("c1", "restore_failed");
    expect(await b.restoreOutcome("c1")).toBe("restore_failed");
    // The successor restores it again (its write takes the marker over) and resumes it.
    await b.list();
    await b.record(journalEntry({ checkpoint_id: "c1", state: "resuming", participants: [e1] }));
    expect(await a.restoreOutcome("c1")).toBeUndefined();
    await b.remove("c1", "restored");
    expect(await a.restoreOutcome("c1")).toBe("restored");
    expect((await a.list()).map((e) => e.checkpoint_id)).toEqual([]);
    // A checkpoint's removal (no outcome) and a key never written: none.
    await a.record(journalEntry({ checkpoint_id: "c2", state: "decided", participants: [e1] }));
    await a.remove("c2");
    expect(await b.restoreOutcome("c2")).toBeUndefined();
    expect(await b.restoreOutcome("c3")).toBeUndefined();
  });

  // Before, it went after 24 hours whatever became of its checkpoint, and a leader answered that
  // restore's retried resume from its memory again, which a successor's restore may have outdated.
  it("outlives the plain markers' compaction for as long as its checkpoint is in the catalog, however old; goes once retention deleted it", async () => {
    const published = new Set(["c1"]);
    let unmounted = false;
    const inCatalog = (id: string) => {
      if (unmounted) throw new Error("checkpoint root not mounted (scripted)");
      return published.has(id);
    };
    const journal = await KvDecisionJournal.open(nats.nc, "joutkeep", undefined, 0, inCatalog);
    await journal.record(journalEntry({ checkpoint_id: "c1", state: "restore_cleanup", participants: [e1] }));
    await journal.record(journalEntry({ checkpoint_id: "c2", state: "decided", participants: [e1] }));
    await journal.remove("c1", "restore_failed");
    await journal.remove("c2");
    // Two days on (the clock markers age by; the server's timestamps stay as they were).
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(Date.now() + 2 * 24 * 60 * 60_000);
    try {
      await journal.compactMarkers();
      expect(await messages("joutkeep")).toBe(1);
      expect(await journal.restoreOutcome("c1")).toBe("restore_failed");
      // A journal that cannot ask the catalog (a tool's) keeps every record.
      await (await KvDecisionJournal.open(nats.nc, "joutkeep", undefined, 0)).compactMarkers();
      expect(await messages("joutkeep")).toBe(1);
      // Retention deleted c1; a catalog that cannot be read (its storage unmounted) tells nothing.
      published.delete("c1");
      unmounted = true;
      await journal.compactMarkers();
      expect(await messages("joutkeep")).toBe(1);
      unmounted = false;
      await journal.compactMarkers();
      expect(await messages("joutkeep")).toBe(0);
      expect(await journal.restoreOutcome("c1")).toBeUndefined();
    } finally {
      vi.useRealTimers();
    }
  });

  // Before, each compaction while the checkpoint root was unmounted logged one warning per record kept.
  it("kept while the catalog cannot be read, with one warning per compaction naming how many, not one per record", async () => {
    const { logger, records } = capturingLogger();
    const inCatalog = (): boolean => {
      throw new Error("checkpoint root not mounted (scripted)");
    };
    const journal = await KvDecisionJournal.open(nats.nc, "joutspam", logger, 0, inCatalog);
    for (const id of ["c1", "c2", "c3"]) {
      await journal.record(journalEntry({ checkpoint_id: id, state: "restore_cleanup", participants: [e1] }));
      await journal.remove(id, "restore_failed");
    }
    await journal.compactMarkers();
    expect(await messages("joutspam")).toBe(3);
    const warned = records().filter((r) => typeof r.msg === "string" && (r.msg as string).startsWith("journal_restore_outcome"));
    expect(warned).toHaveLength(1);
    expect(warned[0]).toMatchObject({ msg: "journal_restore_outcomes_kept_catalog_unreadable", records: 3, keys: ["c1", "c2", "c3"], module: "journal" });
  });

  // A marker no coordinator wrote (by hand, or a buggy version), under a key that is no checkpoint id:
  // the daemon's catalog refuses the id (invalid_request), and such a record was kept for ever.
  it("one under a key that is no checkpoint id goes at the plain markers' age, with one warning naming it; valid entries and records stay", async () => {
    const { logger, records } = capturingLogger();
    const root = await mkdtemp(join(tmpdir(), "gym-ckpt-journal-keys-"));
    try {
      await mkdir(join(root, "c1"));
      await writeFile(join(root, "c1", "checkpoint.json"), "{}\n");
      const catalog = new CheckpointCatalog(root);
      const journal = await KvDecisionJournal.open(nats.nc, "jbadkey", logger, 0, (id) => catalog.has(id));
      await journal.record(journalEntry({ checkpoint_id: "c1", state: "restore_cleanup", participants: [e1] }));
      await journal.remove("c1", "restore_failed");
      await journal.record(journalEntry({ checkpoint_id: "c2", state: "open", participants: [e1] }));
      // Valid KV keys, invalid checkpoint ids: reserved, a leading underscore, a character ids never hold.
      const bucket = journalBucket("jbadkey");
      const js = jetstream(nats.nc);
      for (const key of ["LATEST", "_odd", "a=b"]) {
        const h = headers();
        h.set("KV-Operation", "PURGE");
        h.set("Nats-Rollup", "sub");
        await js.publish(`$KV.${bucket}.${key}`, JSON.stringify({ restore: "restored" }), { headers: h });
      }
      expect(await messages("jbadkey")).toBe(5);
      await journal.compactMarkers();
      expect(await messages("jbadkey")).toBe(2);
      expect(await journal.restoreOutcome("c1")).toBe("restore_failed");
      expect((await journal.list()).map((e) => e.checkpoint_id)).toEqual(["c2"]);
      const warned = records().filter((r) => r.level === 40);
      expect(warned).toHaveLength(1);
      expect(warned[0]).toMatchObject({ msg: "journal_markers_of_invalid_ids_dropped", markers: 3, module: "journal" });
      expect([...(warned[0]!["keys"] as string[])].sort()).toEqual(["LATEST", "_odd", "a=b"]);
      // Nothing left to drop: no warning again.
      await journal.compactMarkers();
      expect(records().filter((r) => r.level === 40)).toHaveLength(1);
    } finally {
      await rm(root, { recursive: true, force: true });
    }
  });
});
