import { mkdir, mkdtemp, readdir, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CtlCheckpointRequestSchema, MAX_ATTEMPT, MAX_CONTROL_MESSAGE_BYTES, MAX_JSON_DEPTH, type Kind } from "../../../protocol/index.js";
import { pino } from "pino";
import { FOUR_KINDS, journalEmptied, journalEntry, makeEngine, writers, type Call } from "./fake-participants.js";
import { MAX_JOURNAL_ENTRY_BYTES, type JournalEntry } from "../../../coordinator/ha/decision-journal.js";
import { NoRespondersFailure, RequestTimeoutFailure } from "../../../coordinator/engine/transport.js";
import { refusalOf } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";

const STAGE: Record<string, Record<Kind, number>> = {
  prepare: { environment: 0, model: 1, agent: 2, resources: 3 },
  resume: { resources: 0, agent: 1, model: 2, environment: 3 },
  retire: { environment: 0, agent: 1, model: 2, resources: 2 },
};

/** Every call of a later stage starts after every call of an earlier stage. */
function expectStaged(calls: Call[], order: Record<Kind, number>): void {
  for (const a of calls) for (const b of calls) if (order[a.kind] < order[b.kind]) expect(a.seq).toBeLessThan(b.seq);
}

const refusal = refusalOf;

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-engine-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("engine ordering", () => {
  it("commit answers once the checkpoint directory it names exists, though the participants wrote nothing and staging it was slow", async () => {
    const { engine, writer, fake } = makeEngine(root);
    // Staging (the directory, LATEST's temp file) held back until every participant was sent its commit.
    const staging = writer as unknown as { stageLatest(id: string): Promise<unknown> };
    const stageLatest = staging.stageLatest.bind(writer);
    staging.stageLatest = async (id) => {
      await waitUntil(() => fake.ops("commit").length === 5, "every commit sent");
      return stageLatest(id);
    };
    await engine.prepare({ checkpoint_id: "c-slow" });
    const reply = await engine.commit({ checkpoint_id: "c-slow", episode_ids: null, stop: false });
    expect((await stat(reply.checkpoint_dir)).isDirectory()).toBe(true); // the controller writes its state there next
    await engine.resume({ checkpoint_id: "c-slow" });
  });

  it("checkpoint: prepare staged env→model→agent→resources, journal decided before any commit, commit all, publish, resume reversed", async () => {
    const { engine, fake, journal, catalog } = makeEngine(root);
    const reply = await engine.checkpoint({ checkpoint_id: "c1", episode_ids: null, stop: false, controller_state: { inline: { step: 3 } } });
    expect(reply.participants).toBe(5);
    const prepares = fake.ops("prepare");
    expect(prepares).toHaveLength(5);
    expectStaged(prepares, STAGE.prepare!);
    const resumes = fake.ops("resume");
    expect(resumes).toHaveLength(5);
    expectStaged(resumes, STAGE.resume!);
    // phases never overlap: all prepares < decision < all commits < all resumes
    const decided = fake.events.indexOf("journal:decided");
    const firstCommit = fake.events.findIndex((e) => e.startsWith("commit:"));
    const lastPrepare = fake.events.map((e) => e.startsWith("prepare:")).lastIndexOf(true);
    expect(lastPrepare).toBeLessThan(decided);
    expect(decided).toBeLessThan(firstCommit);
    expect(fake.events.filter((e) => e.startsWith("journal:"))).toEqual(["journal:open", "journal:decided"]);
    expect(Math.max(...fake.ops("commit").map((c) => c.seq))).toBeLessThan(Math.min(...resumes.map((c) => c.seq)));
    // every message carries the epoch and an absolute deadline
    for (const call of fake.calls) {
      expect(call.body.epoch).toBe(7);
      expect(typeof call.body.deadline_ts).toBe("number");
    }
    await journalEmptied(journal);
    const manifest = await catalog.get("c1");
    expect(manifest.participants.map((p) => `${p.kind}/${p.instance}`)).toHaveLength(5);
    expect(manifest.controller_state).toEqual({ inline: { step: 3 } });
    expect(await catalog.latest()).toBe("c1");
  });

  it("prepare stops at the first stage that is not fully prepared and returns per-participant blockers", async () => {
    const { engine, fake } = makeEngine(root);
    fake.set("model", "m1", "prepare", { notReady: ["r7", "r8-a1"] });
    const reply = await engine.prepare({ checkpoint_id: "c2" });
    expect(reply.prepared).toBe(false);
    expect(reply.stopped_at).toEqual(["model"]);
    expect(reply.blockers).toEqual([{ kind: "model", instance: "m1", blockers: ["r7", "r8-a1"], blocker_count: 2, code: null }]);
    expect(fake.ops("prepare").map((c) => c.kind)).toEqual(["environment", "model"]);
    // commit refused in the wrong phase, nothing sent
    const before = fake.calls.length;
    expect((await refusal(engine.commit({ checkpoint_id: "c2", episode_ids: null, stop: false }))).code).toBe("invalid_phase");
    expect(fake.calls.length).toBe(before);
  });

  it("commit refuses a scope naming a restart prepare reported before journaling the decision, so the corrected scope still commits", async () => {
    const { engine, fake, journal } = makeEngine(root);
    fake.set("model", "m1", "prepare", { restarts: ["r9-a1"] });
    const prepared = await engine.prepare({ checkpoint_id: "c40" });
    expect(prepared.restarts).toEqual(["r9-a1"]);
    const entryBefore = journal.entries.get("c40");
    const wrong = await refusal(engine.commit({ checkpoint_id: "c40", episode_ids: [{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r9", attempt: 1 }], stop: false }));
    expect(wrong.code).toBe("restart_in_scope");
    // nothing changed: no decision journaled, no commit sent
    expect(fake.events).not.toContain("journal:decided");
    expect(fake.ops("commit")).toHaveLength(0);
    expect(journal.entries.get("c40")).toEqual(entryBefore);
    const reply = await engine.commit({ checkpoint_id: "c40", episode_ids: [{ rollout_id: "r1", attempt: 0 }], stop: false });
    expect(reply.participants).toHaveLength(5);
    expect(fake.events.filter((e) => e.startsWith("journal:"))).toEqual(["journal:open", "journal:decided"]);
  });

  it("a scope naming one rollout at two attempts is invalid_request before anything is journaled or sent (commit: still prepared; checkpoint: nothing at all)", async () => {
    const { engine, fake, journal } = makeEngine(root);
    const twice = [
      { rollout_id: "r1", attempt: 0 },
      { rollout_id: "r2", attempt: 0 },
      { rollout_id: "r1", attempt: 1 },
    ];
    await engine.prepare({ checkpoint_id: "c47" });
    const entryBefore = journal.entries.get("c47");
    const wrong = await refusal(engine.commit({ checkpoint_id: "c47", episode_ids: twice, stop: false }));
    expect(wrong.code).toBe("invalid_request");
    expect(wrong.message).toContain("rollout r1 at attempts 0 and 1");
    expect(fake.events).not.toContain("journal:decided");
    expect(fake.ops("commit")).toHaveLength(0);
    expect(journal.entries.get("c47")).toEqual(entryBefore);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "c47", phase: "prepared" });
    // The same attempt named twice is one entry: that scope commits.
    const reply = await engine.commit({ checkpoint_id: "c47", episode_ids: [twice[0]!, twice[1]!, twice[0]!], stop: false });
    expect(reply.participants).toHaveLength(5);
    await engine.resume({ checkpoint_id: "c47" });
    await journalEmptied(journal);

    const calls = fake.calls.length;
    const journaled = journal.log.length;
    const refused = await refusal(engine.checkpoint({ checkpoint_id: "c48", episode_ids: twice, stop: false, controller_state: null }));
    expect(refused.code).toBe("invalid_request");
    expect(fake.calls).toHaveLength(calls);
    expect(journal.log).toHaveLength(journaled);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("a null-scope commit is refused before the decision when a participant reported scope_required, so a scoped commit still goes ahead", async () => {
    const { engine, fake, journal } = makeEngine(root);
    fake.set("model", "m1", "prepare", { scopeRequired: true });
    await engine.prepare({ checkpoint_id: "c45" });
    const entryBefore = journal.entries.get("c45");
    const wrong = await refusal(engine.commit({ checkpoint_id: "c45", episode_ids: null, stop: false }));
    expect(wrong.code).toBe("invalid_request");
    expect(wrong.message).toContain("model/m1");
    // Says how to name them on each surface: a new operator's `gym-ckpt checkpoint` met only "name the episodes you continue".
    expect(wrong.message).toContain("episode_ids (the CLI's --episodes");
    // nothing changed: no decision journaled, no commit sent, still prepared
    expect(fake.events).not.toContain("journal:decided");
    expect(fake.ops("commit")).toHaveLength(0);
    expect(journal.entries.get("c45")).toEqual(entryBefore);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "c45", phase: "prepared" });
    const reply = await engine.commit({ checkpoint_id: "c45", episode_ids: [{ rollout_id: "r1", attempt: 0 }], stop: false });
    expect(reply.participants).toHaveLength(5);
    await engine.resume({ checkpoint_id: "c45" });

    // The convenience op: refused after its prepare, before any commit; everyone resumed, nothing published.
    const events = fake.events.length;
    const refused = await refusal(engine.checkpoint({ checkpoint_id: "c46", episode_ids: null, stop: false, controller_state: null }));
    expect(refused.code).toBe("invalid_request");
    const after = fake.events.slice(events);
    expect(after.some((e) => e.startsWith("commit:"))).toBe(false);
    expect(after).not.toContain("journal:decided");
    expect(after.filter((e) => e.startsWith("resume:"))).toHaveLength(5);
    expect(engine.openCheckpoint).toBeNull();
    await journalEmptied(journal);
  });

  it("a scope too large to journal is refused (payload_too_large) before anything is sent or journaled", async () => {
    // ~25k episodes: the controller's request could fit one NATS message, the decision could not.
    const huge = Array.from({ length: 25_000 }, (_, i) => ({ rollout_id: `rollout-${String(i).padStart(8, "0")}`, attempt: 1 }));
    const { engine, fake, journal } = makeEngine(root);
    // The convenience op: refused before a single prepare leaves.
    const early = await refusal(engine.checkpoint({ checkpoint_id: "c50", episode_ids: huge, stop: false, controller_state: null }));
    expect(early.code).toBe("payload_too_large");
    expect(fake.calls).toHaveLength(0);
    expect(journal.log).toEqual([]);
    expect(engine.openCheckpoint).toBeNull();
    // The fine-grained op: refused before the decision; the prepared checkpoint still commits.
    await engine.prepare({ checkpoint_id: "c51" });
    const entryBefore = journal.entries.get("c51");
    const late = await refusal(engine.commit({ checkpoint_id: "c51", episode_ids: huge, stop: false }));
    expect(late.code).toBe("payload_too_large");
    expect(fake.ops("commit")).toHaveLength(0);
    expect(journal.entries.get("c51")).toEqual(entryBefore);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "c51", phase: "prepared" });
    const reply = await engine.commit({ checkpoint_id: "c51", episode_ids: huge.slice(0, 10), stop: false });
    expect(reply.participants).toHaveLength(5);
    await engine.publish({ checkpoint_id: "c51", controller_state: null });
    await engine.resume({ checkpoint_id: "c51" });
    // Restore: refused before anything opens or is sent.
    const sent = fake.calls.length;
    const restore = await refusal(engine.restore({ episode_ids: huge }));
    expect(restore.code).toBe("payload_too_large");
    expect(fake.calls.length).toBe(sent);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("a restore scope whose restored entry (the restorers' incarnations) would not fit the journal is refused (payload_too_large) before anything is sent, though its clean-up's entry would", async () => {
    const { engine, fake, journal, catalog } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    const participants = FOUR_KINDS.map((m) => ({ kind: m.kind, instance: m.instance }));
    const sizeOf = (scope: { rollout_id: string; attempt: number }[], fields: Partial<JournalEntry>) =>
      Buffer.byteLength(JSON.stringify(journalEntry({ checkpoint_id: "base", state: "restore_cleanup", participants, checkpoint_dir: catalog.dirFor("base"), scope, ...fields })));
    // A scope whose clean-up entry (with where to retire) is 60 bytes under the limit: the restored
    // entry, naming five 64-character incarnations instead, is over it.
    const cleanupSize = (s: { rollout_id: string; attempt: number }[]) => sizeOf(s, { retire_at: participants });
    const target = MAX_JOURNAL_ENTRY_BYTES - 60;
    const episode = (i: number) => ({ rollout_id: `rollout-${String(i).padStart(8, "0")}`, attempt: 0 });
    const perEpisode = cleanupSize([episode(0), episode(1)]) - cleanupSize([episode(0)]);
    const scope = Array.from({ length: Math.floor((target - cleanupSize([])) / perEpisode) - 1 }, (_, i) => episode(i));
    const last = { rollout_id: "p", attempt: 0 };
    scope.push(last);
    last.rollout_id = "p".repeat(1 + target - cleanupSize(scope));
    const incarnations = Object.fromEntries(FOUR_KINDS.map((m) => [`${m.kind}.${m.instance}`, "i".repeat(64)]));
    expect(cleanupSize(scope)).toBe(target);
    expect(sizeOf(scope, { state: "restored", incarnations })).toBeGreaterThan(MAX_JOURNAL_ENTRY_BYTES + 40);
    for (const m of FOUR_KINDS) fake.restorers.set(`${m.kind}.${m.instance}`, "i".repeat(64));
    const sent = fake.calls.length;
    const refused = await refusal(engine.restore({ episode_ids: scope }));
    expect(refused.code).toBe("payload_too_large");
    expect(fake.calls.length).toBe(sent);
    expect(journal.entries.size).toBe(0);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("a restore scope whose clean-up retire (attempt+1, a digit longer each: 9 → 10) would not fit one message is refused (payload_too_large) before anything is sent, though its journal entries would fit", async () => {
    const { engine, fake, journal, catalog } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    const participants = FOUR_KINDS.map((m) => ({ kind: m.kind, instance: m.instance }));
    const incarnations = Object.fromEntries(FOUR_KINDS.map((m) => [`${m.kind}.${m.instance}`, "i".repeat(64)]));
    // The largest entry a restore journals: resuming, with every restorer's incarnation at its longest.
    const resumingSize = (scope: { rollout_id: string; attempt: number }[]) =>
      Buffer.byteLength(JSON.stringify(journalEntry({ checkpoint_id: "base", state: "resuming", participants, checkpoint_dir: catalog.dirFor("base"), scope, incarnations })));
    const episode = (i: number, attempt: number) => ({ rollout_id: `r${String(i).padStart(6, "0")}`, attempt });
    const perEpisode = resumingSize([episode(0, 9), episode(1, 9)]) - resumingSize([episode(0, 9)]);
    const count = Math.floor((MAX_JOURNAL_ENTRY_BYTES - 100 - resumingSize([])) / perEpisode);
    const scope = Array.from({ length: count }, (_, i) => episode(i, 9));
    expect(resumingSize(scope)).toBeLessThanOrEqual(MAX_JOURNAL_ENTRY_BYTES);
    // What the clean-up of a failed restore sends every participant: over one NATS message.
    const cleanupRetire = { checkpoint_id: "base", deadline_ts: Date.now() / 1000 + 30, epoch: 1, episode_ids: scope.map((e) => ({ ...e, attempt: 10 })) };
    expect(Buffer.byteLength(JSON.stringify(cleanupRetire))).toBeGreaterThan(MAX_CONTROL_MESSAGE_BYTES);
    const sent = fake.calls.length;
    const refused = await refusal(engine.restore({ episode_ids: scope }));
    expect(refused.code).toBe("payload_too_large");
    expect(refused.message).toContain("retire");
    expect(fake.calls.length).toBe(sent);
    expect(journal.entries.size).toBe(0);
    expect(engine.openCheckpoint).toBeNull();
    // The same number of episodes at attempt 0 (attempt+1 no longer) restores.
    const reply = await engine.restore({ episode_ids: scope.map((e) => ({ ...e, attempt: 0 })) });
    expect(reply.participants).toHaveLength(5);
    await engine.resume({ checkpoint_id: "base" });
  });

  it("publish retried with another controller state while the checkpoint is still open is a conflict; the same one gets its reply", async () => {
    const { engine, catalog } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "c60" });
    await engine.commit({ checkpoint_id: "c60", episode_ids: null, stop: false });
    const first = await engine.publish({ checkpoint_id: "c60", controller_state: { inline: { step: 1 } } });
    expect((await refusal(engine.publish({ checkpoint_id: "c60", controller_state: { inline: { step: 2 } } }))).code).toBe("checkpoint_conflict");
    expect(await engine.publish({ checkpoint_id: "c60", controller_state: { inline: { step: 1 } } })).toEqual(first);
    expect((await catalog.get("c60")).controller_state).toEqual({ inline: { step: 1 } });
    await engine.resume({ checkpoint_id: "c60" });
  });

  it("warns when a participant of LATEST is missing from the registry, without reading LATEST again after its own publication", async () => {
    const lines: string[] = [];
    const logger = pino({ level: "warn" }, { write: (line: string) => void lines.push(line) });
    const members = [...FOUR_KINDS];
    const { engine, catalog } = makeEngine(root, { members, logger });
    let reads = 0;
    const latest = catalog.latest.bind(catalog);
    catalog.latest = () => (reads++, latest());
    await engine.checkpoint({ checkpoint_id: "w1", episode_ids: null, stop: false, controller_state: null });
    const gone = members.pop()!; // its heartbeat lapsed: the registry no longer lists it
    reads = 0;
    await engine.checkpoint({ checkpoint_id: "w2", episode_ids: null, stop: false, controller_state: null });
    const warning = lines.map((l) => JSON.parse(l) as { msg: string; latest?: string; absent?: string[] }).find((l) => l.msg === "latest_participants_missing");
    expect(warning).toMatchObject({ latest: "w1", absent: [`${gone.kind}/${gone.instance}`] });
    expect(reads).toBe(0);
  });

  it("inline controller state nested too deep is refused (invalid_request) before anything is sent or journaled", async () => {
    const { engine, fake, journal } = makeEngine(root);
    let deep: unknown = 1;
    for (let i = 0; i < 20_000; i++) deep = [deep];
    expect((await refusal(engine.checkpoint({ checkpoint_id: "c70", episode_ids: null, stop: false, controller_state: { inline: deep } }))).code).toBe("invalid_request");
    expect(fake.calls).toHaveLength(0);
    expect(journal.log).toHaveLength(0);
    expect(engine.openCheckpoint).toBeNull();
  });

  it(`an inline controller state nested MAX_JSON_DEPTH levels deep, which the controller API takes, is published by checkpoint and publish, and their retries answered`, async () => {
    // Before, the ops keyed a retry by the canonical JSON of the state inside an envelope (an array,
    // its {inline}), whose levels counted against MAX_JSON_DEPTH: checkpoint refused a state 127 or
    // 128 levels deep, publish one 128 deep, invalid_request "nested more than 128 levels deep".
    let deep: unknown = 1;
    for (let i = 0; i < MAX_JSON_DEPTH; i++) deep = [deep];
    const state = CtlCheckpointRequestSchema.parse({ controller_state: { inline: deep } }).controller_state!;
    const { engine, catalog } = makeEngine(root);
    const request = { checkpoint_id: "c71", episode_ids: null, stop: false, controller_state: state };
    const reply = await engine.checkpoint(request);
    expect(await engine.checkpoint(request)).toEqual(reply);
    expect((await catalog.get("c71")).controller_state).toEqual(state);
    await engine.prepare({ checkpoint_id: "c72" });
    await engine.commit({ checkpoint_id: "c72", episode_ids: null, stop: false });
    const published = await engine.publish({ checkpoint_id: "c72", controller_state: state });
    expect(await engine.publish({ checkpoint_id: "c72", controller_state: state })).toEqual(published);
    expect((await catalog.get("c72")).controller_state).toEqual(state);
    await engine.resume({ checkpoint_id: "c72" });
  });

  it("the convenience op aborts (resumes everyone) when prepare is incomplete; unreachable is a blocker", async () => {
    const { engine, fake, writer } = makeEngine(root);
    fake.set("agent", "a2", "prepare", "unreachable");
    const error = await refusal(engine.checkpoint({ checkpoint_id: "c3", episode_ids: null, stop: false, controller_state: null }));
    expect(error.code).toBe("prepare_incomplete");
    expect(error.message).toContain("agent/a2: unreachable");
    expect(fake.ops("prepare").some((c) => c.kind === "resources")).toBe(false);
    expect(fake.ops("commit")).toHaveLength(0);
    expect(fake.ops("resume")).toHaveLength(5);
    expectStaged(fake.ops("resume"), STAGE.resume!);
    expect(engine.openCheckpoint).toBeNull();
    // What publication staged at prepare (the checkpoint directory, LATEST's temp file) is gone.
    await writer.settled();
    expect(await readdir(root)).toEqual([]);
  });

  it("a retry of a convenience op that aborted gets how it failed (prepare_incomplete, its blockers), not a bare stale_checkpoint; nothing is sent again", async () => {
    const { engine, fake } = makeEngine(root);
    fake.set("agent", "a2", "prepare", "unreachable");
    const request = { checkpoint_id: "c3r", episode_ids: null, stop: false, controller_state: null };
    const first = await refusal(engine.checkpoint(request));
    const sent = fake.calls.length;
    const retry = await refusal(engine.checkpoint(request));
    expect(retry.code).toBe("prepare_incomplete");
    expect(retry.message).toContain(first.message);
    expect(retry.message).toContain("the id is spent");
    expect(fake.calls).toHaveLength(sent);
    // A fine-grained prepare of the spent id is still told it was resumed.
    expect((await refusal(engine.prepare({ checkpoint_id: "c3r" }))).code).toBe("stale_checkpoint");
  });

  it("a request of a published checkpoint op with other arguments (checkpoint_conflict) is not kept as its failure: once its reply is forgotten, a retry with its own arguments still gets it rebuilt from checkpoint.json", async () => {
    const { engine } = makeEngine(root, { retention: 20 });
    const request = { checkpoint_id: "c-pub", episode_ids: null, stop: false, controller_state: { inline: { step: 1 } } };
    const reply = await engine.checkpoint(request);
    expect((await refusal(engine.checkpoint({ ...request, controller_state: { inline: { step: 2 } } }))).code).toBe("checkpoint_conflict");
    // 8 later checkpoints push its kept reply out: the retry is answered from checkpoint.json.
    for (let i = 0; i < 8; i++) await engine.checkpoint({ ...request, checkpoint_id: `c-later${i}` });
    const again = await engine.checkpoint(request);
    expect(again.checkpoint_id).toBe("c-pub");
    expect(again.manifest_path).toBe(reply.manifest_path);
  });

  it("resume continues past failures and reports them all", async () => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "c4" });
    fake.set("agent", "a1", "resume", "unreachable");
    fake.set("model", "m1", "resume", { error: "internal_error" });
    const error = await refusal(engine.resume({ checkpoint_id: "c4" }));
    expect(error.code).toBe("unreachable");
    expect(error.message).toContain("agent/a1");
    expect(error.message).toContain("model/m1");
    expect(fake.ops("resume").map((c) => c.kind)).toContain("environment");
    await journalEmptied(journal);
    // a retry sends it again to those two only (resume-retry-after-failure.test.ts), then is idempotent
    fake.set("agent", "a1", "resume", "ok");
    fake.set("model", "m1", "resume", "ok");
    const before = fake.ops("resume").length;
    expect((await engine.resume({ checkpoint_id: "c4" })).participants.map((p) => p.instance).sort()).toEqual(["a1", "m1"]);
    expect(fake.ops("resume").slice(before).map((c) => c.instance).sort()).toEqual(["a1", "m1"]);
    expect((await engine.resume({ checkpoint_id: "c4" })).participants).toEqual([]);
    // a resumed id is fenced
    expect((await refusal(engine.prepare({ checkpoint_id: "c4" }))).code).toBe("stale_checkpoint");
  });

  it("the convenience op succeeds once published even when a participant fails to resume; the reply names it and a retry gets the same reply", async () => {
    const { engine, fake, catalog } = makeEngine(root, { retention: 1 });
    await engine.checkpoint({ checkpoint_id: "k1", episode_ids: null, stop: false, controller_state: null });
    fake.set("agent", "a1", "resume", "unreachable");
    const reply = await engine.checkpoint({ checkpoint_id: "k2", episode_ids: null, stop: false, controller_state: null });
    expect(reply.resume_failures).toEqual([{ kind: "agent", instance: "a1", code: "unreachable", detail: expect.stringContaining("agent/a1") }]);
    expect(reply.deleted).toEqual(["k1"]); // "k2" is durable and LATEST: the controller knows it is its latest
    expect(await catalog.latest()).toBe("k2");
    expect(fake.ops("resume").filter((c) => c.body.checkpoint_id === "k2").map((c) => c.kind)).toContain("environment"); // past the failure
    expect(await engine.checkpoint({ checkpoint_id: "k2", episode_ids: null, stop: false, controller_state: null })).toEqual(reply);
    fake.set("agent", "a1", "resume", "ok");
    fake.state.set("agent.a1", { phase: "idle", checkpoint_id: null }); // its lease expired: it resumed (parked in k2, it refuses k3's prepare)
    expect((await engine.checkpoint({ checkpoint_id: "k3", episode_ids: null, stop: false, controller_state: null })).resume_failures).toEqual([]);
  });

  it("the convenience op publishes while the participants resume, and replies once both are done", async () => {
    let resumedBeforeWrite = -1;
    const { engine, fake, catalog, journal } = makeEngine(root, {
      hooks: {
        beforePublication: async () => {
          // the resume is not waiting for checkpoint.json: all five complete while it is held here
          await waitUntil(() => fake.ops("resume").length === 5, "the resume before checkpoint.json", 2000);
          resumedBeforeWrite = fake.ops("resume").length;
        },
      },
    });
    const reply = await engine.checkpoint({ checkpoint_id: "o1", episode_ids: null, stop: false, controller_state: null });
    expect(resumedBeforeWrite).toBe(5);
    expect(await catalog.latest()).toBe("o1");
    expect(reply.resume_failures).toEqual([]);
    expect(engine.openCheckpoint).toBeNull();
    await journalEmptied(journal);
  });

  it("a publication that fails while the participants resume fails the op and leaves nothing published or open", async () => {
    // The state file is there when the op starts (it is checked before anything is sent) and gone when publication reads it.
    const { engine, fake, catalog, journal } = makeEngine(root, { hooks: { beforePublication: (id) => rm(join(root, id, "state.json")) } });
    await mkdir(join(root, "o2"));
    await writeFile(join(root, "o2", "state.json"), "{}\n");
    const error = await refusal(engine.checkpoint({ checkpoint_id: "o2", episode_ids: null, stop: false, controller_state: { file: "state.json" } }));
    expect(error.code).toBe("not_found");
    // The decision is withdrawn before the abort's resume: participants keep their commit replies
    // after resuming, so a successor finding `decided` would publish what its controller saw fail.
    expect(journal.log.filter((e) => e.op === "record").map((e) => e.state)).toEqual(["open", "decided", "open"]);
    const withdrawn = fake.events.lastIndexOf("journal:open");
    expect(fake.events.slice(withdrawn + 1).filter((e) => e.startsWith("resume:"))).toHaveLength(5);
    expect(new Set(fake.ops("resume").map((c) => `${c.kind}/${c.instance}`)).size).toBe(5);
    await expect(catalog.get("o2")).rejects.toMatchObject({ code: "not_found" });
    expect(await catalog.latest()).toBeNull();
    expect(engine.openCheckpoint).toBeNull();
    await journalEmptied(journal);
    expect((await refusal(engine.prepare({ checkpoint_id: "o2" }))).code).toBe("stale_checkpoint");
  });

  it("a decision that cannot be withdrawn after a failed publication: everyone resumed, the op answers outcome_unknown", async () => {
    const { engine, fake, journal } = makeEngine(root, { hooks: { beforePublication: (id) => rm(join(root, id, "state.json")) } });
    await mkdir(join(root, "o3"));
    await writeFile(join(root, "o3", "state.json"), "{}\n");
    const record = journal.record.bind(journal);
    journal.record = async (entry) => {
      if (entry.state === "open" && journal.entries.get(entry.checkpoint_id)?.state === "decided") throw new Error("KV unavailable");
      await record(entry);
    };
    const error = await refusal(engine.checkpoint({ checkpoint_id: "o3", episode_ids: null, stop: false, controller_state: { file: "state.json" } }));
    expect(error.code).toBe("outcome_unknown");
    expect(error.message).toContain("could not be withdrawn");
    expect(new Set(fake.ops("resume").map((c) => `${c.kind}/${c.instance}`)).size).toBe(5);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("resume of a committed, unpublished checkpoint withdraws its decision first; if it cannot, nothing is sent", async () => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "o4" });
    await engine.commit({ checkpoint_id: "o4", episode_ids: null, stop: false });
    const record = journal.record.bind(journal);
    let failing = true;
    journal.record = async (entry) => {
      if (failing) throw new Error("KV unavailable");
      await record(entry);
    };
    await expect(engine.resume({ checkpoint_id: "o4" })).rejects.toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("KV unavailable") });
    expect(fake.ops("resume")).toHaveLength(0);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "o4", phase: "committed" });
    failing = false;
    await engine.resume({ checkpoint_id: "o4" });
    expect(journal.log.filter((e) => e.op === "record").map((e) => e.state)).toEqual(["open", "decided", "open"]);
    expect(fake.ops("resume")).toHaveLength(5);
  });

  it("a participant that restarted after the checkpoint opened is not sent its messages: its new process never took part", async () => {
    const incarnations = new Map(["agent.a1", "agent.a2", "environment.e1", "model.m1", "resources.r1"].map((k) => [k, "old"]));
    const { engine, fake } = makeEngine(root, { incarnations });
    await engine.prepare({ checkpoint_id: "c30" });
    incarnations.set("model.m1", "new"); // SIGKILLed and started again while the checkpoint is open
    const error = await refusal(engine.commit({ checkpoint_id: "c30", episode_ids: null, stop: false }));
    expect(error.code).toBe("unreachable");
    expect(error.message).toContain("model/m1 restarted after checkpoint c30 opened (incarnation old → new)");
    expect(fake.ops("commit").map((c) => `${c.kind}/${c.instance}`)).not.toContain("model/m1");
    // resume: the new process holds nothing of c30 (it counts as resumed) and is not fenced by it
    const resumed = await engine.resume({ checkpoint_id: "c30" });
    expect(resumed.participants.find((p) => p.instance === "m1")).toMatchObject({ idempotent: true });
    expect(fake.ops("resume").map((c) => `${c.kind}/${c.instance}`)).toEqual(["resources/r1", "agent/a1", "agent/a2", "environment/e1"]);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("guarded messages carry each member's incarnation recorded at open, even after the view loses it; other ops carry none", async () => {
    const incarnations = new Map([
      ["environment.e1", "env-1"],
      ["model.m1", "model-1"],
      ["agent.a1", "agent-1"],
      ["resources.r1", "res-1"],
    ]); // agent.a2 unknown to the view: addressed to any incarnation
    const { engine, fake } = makeEngine(root, { incarnations });
    await engine.prepare({ checkpoint_id: "c40" });
    incarnations.delete("model.m1"); // the old process's entry went away; the new one is not announced yet
    await engine.renew({ checkpoint_id: "c40" });
    await engine.commit({ checkpoint_id: "c40", episode_ids: null, stop: false });
    await engine.resume({ checkpoint_id: "c40" });
    for (const op of ["prepare", "renew", "commit", "resume"] as const) {
      const sent = Object.fromEntries(fake.ops(op).map((c) => [`${c.kind}.${c.instance}`, c.body.incarnation]));
      expect(sent).toEqual({ "environment.e1": "env-1", "model.m1": "model-1", "agent.a1": "agent-1", "agent.a2": undefined, "resources.r1": "res-1" });
      for (const call of fake.ops(op)) if (call.instance === "a2") expect("incarnation" in call.body).toBe(false);
    }
    await engine.retire({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await engine.forget({ rollout_ids: ["r1"] });
    for (const call of [...fake.ops("retire"), ...fake.ops("forget")]) expect("incarnation" in call.body).toBe(false);
  });

  it("a restore in flight shows as restoring in the open checkpoint, not as a prepare (a controller's status tells them apart)", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    const request = fake.request.bind(fake);
    const seen: unknown[] = [];
    fake.request = async (subject, body, options) => {
      if (subject.endsWith(".restore") && seen.length === 0) seen.push(engine.openCheckpoint);
      return request(subject, body, options);
    };
    await engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(seen).toEqual([{ checkpoint_id: "base", phase: "restoring", epoch: 7 }]);
    expect(engine.openCheckpoint?.phase).toBe("restored");
  });

  it("a restore's resume is addressed to the process that restored, while the view still lags; a later restart is still skipped", async () => {
    const incarnations = new Map(["agent.a1", "agent.a2", "environment.e1", "model.m1", "resources.r1"].map((k) => [k, "old"]));
    const { engine, fake } = makeEngine(root, { incarnations });
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    // model/m1 was restarted before the restore; the view still shows the old process
    fake.restorers.set("model.m1", "new");
    await engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await engine.renew({ checkpoint_id: "base" });
    await engine.resume({ checkpoint_id: "base" });
    const resumeTo = (instance: string) => fake.ops("resume").filter((c) => c.instance === instance && c.body.checkpoint_id === "base");
    expect(fake.ops("renew").find((c) => c.instance === "m1")?.body.incarnation).toBe("new");
    expect(resumeTo("m1").at(-1)?.body.incarnation).toBe("new"); // not "old", which the new process would refuse
    expect(resumeTo("e1").at(-1)?.body.incarnation).toBe("old");

    // Again, with the view catching up after the restore: still sent to the restorer.
    fake.restorers.set("model.m1", "second");
    await engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    incarnations.set("model.m1", "second");
    await engine.resume({ checkpoint_id: "base" });
    expect(resumeTo("m1").at(-1)?.body.incarnation).toBe("second");

    // A restart after the restore (the view shows a process that neither the view at open nor the
    // restore reply named) is skipped: it lost what it restored, so the resume runs the restore's
    // clean-up (attempt+1 retired everywhere, everyone resumed) and answers restore_failed.
    fake.restorers.set("model.m1", "third");
    await engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    incarnations.set("model.m1", "fourth");
    const before = resumeTo("m1").length;
    fake.calls.length = 0;
    const error = await refusal(engine.resume({ checkpoint_id: "base" }));
    expect(error.code).toBe("restore_failed");
    expect(error.message).toContain("model/m1");
    expect(fake.ops("retire").map((c) => c.body.episode_ids)).toEqual(Array(5).fill([{ rollout_id: "r1", attempt: 1 }]));
    expect(fake.ops("resume").filter((c) => c.instance !== "m1")).toHaveLength(4);
    expect(resumeTo("m1")).toHaveLength(0); // the new process never restored: nothing to resume there
    expect(before).toBeGreaterThan(0);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("a stale_incarnation refusal (a restart the view did not show yet): commit fails with that code, resume counts it as resumed", async () => {
    const incarnations = new Map(["agent.a1", "agent.a2", "environment.e1", "model.m1", "resources.r1"].map((k) => [k, "old"]));
    const { engine, fake } = makeEngine(root, { incarnations });
    await engine.prepare({ checkpoint_id: "c41" });
    fake.set("model", "m1", "commit", { error: "stale_incarnation" });
    fake.set("model", "m1", "resume", { error: "stale_incarnation" });
    const error = await refusal(engine.commit({ checkpoint_id: "c41", episode_ids: null, stop: false }));
    expect(error.code).toBe("stale_incarnation");
    expect(error.message).toContain("model/m1: stale_incarnation");
    expect(fake.ops("commit").find((c) => c.instance === "m1")?.body.incarnation).toBe("old");
    const resumed = await engine.resume({ checkpoint_id: "c41" });
    expect(resumed.participants.find((p) => p.instance === "m1")).toMatchObject({ idempotent: true });
    expect(fake.ops("resume")).toHaveLength(5); // sent (the view showed no restart) and refused
    expect(engine.openCheckpoint).toBeNull();
    // prepare: the refusing participant is a blocker with the code, and the checkpoint stops at its stage
    fake.set("model", "m1", "prepare", { error: "stale_incarnation" });
    const prepared = await engine.prepare({ checkpoint_id: "c42" });
    expect(prepared.prepared).toBe(false);
    expect(prepared.blockers).toEqual([{ kind: "model", instance: "m1", blockers: [], blocker_count: 0, code: "stale_incarnation" }]);
    await engine.resume({ checkpoint_id: "c42" });
  });

  it("a request timeout is retried idempotently within the deadline, then reported as outcome_unknown", async () => {
    const { engine, fake } = makeEngine(root, { attemptTimeoutMs: 1000 });
    fake.set("environment", "e1", "prepare", "timeout");
    const reply = await engine.prepare({ checkpoint_id: "c5" });
    expect(reply.prepared).toBe(false);
    expect(reply.blockers[0]).toMatchObject({ kind: "environment", code: "outcome_unknown" });
    const tries = fake.ops("prepare").filter((c) => c.kind === "environment");
    expect(tries.length).toBeGreaterThan(5);
    expect(new Set(tries.map((c) => JSON.stringify(c.body))).size).toBe(1);
  });

  it("request timeout = remaining time + slack", async () => {
    const { engine, fake, clock } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "c6", deadline_ts: (clock.now() + 4000) / 1000 });
    expect(fake.calls[0]!.timeoutMs).toBe(4000 + 5000);
  });

  it("unreachable is reported at once, without retries", async () => {
    const { engine, fake } = makeEngine(root);
    fake.set("environment", "e1", "prepare", "unreachable");
    await engine.prepare({ checkpoint_id: "c7" });
    expect(fake.ops("prepare")).toHaveLength(1);
  });

  it("refusals change nothing: unknown checkpoint, wrong phase, conflicting id", async () => {
    const { engine, fake, journal } = makeEngine(root);
    expect((await refusal(engine.commit({ checkpoint_id: "nope", episode_ids: null, stop: false }))).code).toBe("not_found");
    expect((await refusal(engine.publish({ checkpoint_id: "nope", controller_state: null }))).code).toBe("not_found");
    expect((await refusal(engine.resume({ checkpoint_id: "nope" }))).code).toBe("not_found");
    expect((await refusal(engine.get({ checkpoint_id: "nope" }))).code).toBe("not_found");
    expect((await refusal(engine.restore({ episode_ids: [] }))).code).toBe("not_found");
    expect(fake.calls.filter((c) => c.op !== "status")).toHaveLength(0); // resume asked who holds it: nobody
    await engine.prepare({ checkpoint_id: "c8" });
    const sent = fake.calls.length;
    expect((await refusal(engine.prepare({ checkpoint_id: "other" }))).code).toBe("checkpoint_conflict");
    expect((await refusal(engine.publish({ checkpoint_id: "c8", controller_state: null }))).code).toBe("invalid_phase");
    expect((await refusal(engine.retire({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).code).toBe("invalid_phase");
    expect((await refusal(engine.forget({ rollout_ids: ["r1"] }))).code).toBe("invalid_phase");
    expect(fake.calls.length).toBe(sent);
    expect(journal.entries.get("c8")?.state).toBe("open");
  });

  it("a prepare re-driven after it succeeded that is not prepared any more (a participant became unreachable) refuses the commit before the decision", async () => {
    const { engine, fake, journal } = makeEngine(root);
    expect((await engine.prepare({ checkpoint_id: "c-again" })).prepared).toBe(true);
    fake.set("model", "m1", "prepare", "unreachable");
    const again = await engine.prepare({ checkpoint_id: "c-again" });
    expect(again.prepared).toBe(false);
    expect(again.blockers).toEqual([{ kind: "model", instance: "m1", blockers: [], blocker_count: 0, code: "unreachable" }]);
    expect((await refusal(engine.commit({ checkpoint_id: "c-again", episode_ids: null, stop: false }))).code).toBe("invalid_phase");
    expect(fake.ops("commit")).toHaveLength(0);
    expect(journal.entries.get("c-again")?.state).toBe("open");
    await engine.resume({ checkpoint_id: "c-again" });
  });

  it("retire and forget go callers before callees: environment, agent, then model and resources", async () => {
    const { engine, fake } = makeEngine(root);
    const reply = await engine.retire({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(reply.participants).toHaveLength(5);
    expectStaged(fake.ops("retire"), STAGE.retire!);
    await engine.forget({ rollout_ids: ["r1"] });
    expectStaged(fake.ops("forget"), STAGE.retire!);
    expect(fake.ops("forget")[0]!.body.checkpoint_id).toBe("forget");
  });
});

describe("all-or-nothing restore", () => {
  it("on a failure retires attempt+1 everywhere within max(deadline, now+30s), each stage until its share, resumes everyone and reports restore_failed", async () => {
    const { engine, fake, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    fake.calls.length = 0;
    // An install that outlived its deadline may still have installed attempt+1: retired there too.
    fake.set("model", "m1", "restore", { error: "deadline_exceeded" });
    const deadline = (clock.now() + 2000) / 1000;
    const error = await refusal(engine.restore({ checkpoint_id: "base", deadline_ts: deadline, episode_ids: [{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r2", attempt: 2 }] }));
    expect(error.code).toBe("restore_failed");
    expect(error.message).toContain("model/m1");
    const restores = fake.ops("restore");
    expect(restores).toHaveLength(5);
    const retires = fake.ops("retire");
    expect(retires).toHaveLength(5);
    expectStaged(retires, STAGE.retire!);
    // Each stage's share of the window once the later stages' request slack (5 s here) is set
    // aside (docs/protocol.md): the last stage's runs to the window's end.
    const window = { environment: (30_000 - 2 * 5000) / 3, agent: (30_000 - 5000) / 2, model: 30_000, resources: 30_000 };
    for (const r of retires) {
      expect(r.body.episode_ids).toEqual([{ rollout_id: "r1", attempt: 1 }, { rollout_id: "r2", attempt: 3 }]);
      expect(r.body.deadline_ts).toBe((clock.now() + window[r.kind as keyof typeof window]) / 1000);
      expect(r.body.checkpoint_id).toBe("base");
    }
    const resumes = fake.ops("resume");
    expect(resumes).toHaveLength(5);
    expectStaged(resumes, STAGE.resume!);
    expect(Math.max(...retires.map((c) => c.seq))).toBeLessThan(Math.min(...resumes.map((c) => c.seq)));
    expect(Math.max(...restores.map((c) => c.seq))).toBeLessThan(Math.min(...retires.map((c) => c.seq)));
    expect(engine.openCheckpoint).toBeNull();
    await journalEmptied(journal);
  });

  it("a clean-up retire that keeps failing is retried until max(deadline, now+30s), then everyone resumes and restore_failed names that participant first", async () => {
    const { engine, fake, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    fake.calls.length = 0;
    fake.set("model", "m1", "restore", { error: "deadline_exceeded" });
    fake.set("resources", "r1", "retire", { error: "internal_error" });
    const start = clock.now();
    const error = await refusal(engine.restore({ checkpoint_id: "base", deadline_ts: (start + 2000) / 1000, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(error.code).toBe("restore_failed");
    expect(error.message.startsWith("attempt+1 could not be retired at resources/r1 (internal_error: scripted)")).toBe(true);
    expect(error.message).toContain("may still be held there");
    const retiresAtR1 = fake.ops("retire").filter((c) => c.instance === "r1");
    expect(retiresAtR1.length).toBeGreaterThan(1);
    for (const r of retiresAtR1) expect(r.body.deadline_ts).toBe((start + 30_000) / 1000);
    expect(clock.now()).toBeLessThanOrEqual(start + 30_000);
    // Only r1 was retried; then everyone resumed, r1 too (the protocol never leaves one parked).
    expect(fake.ops("retire").filter((c) => c.instance !== "r1").length).toBe(4);
    const resumes = fake.ops("resume");
    expect(resumes.map((c) => `${c.kind}/${c.instance}`).sort()).toEqual(["agent/a1", "agent/a2", "environment/e1", "model/m1", "resources/r1"]);
    expect(Math.max(...retiresAtR1.map((c) => c.seq))).toBeLessThan(Math.min(...resumes.map((c) => c.seq)));
    expect(engine.openCheckpoint).toBeNull();
    const resumed = await refusal(engine.resume({ checkpoint_id: "base" }));
    expect(resumed.code).toBe("restore_failed");
    expect(resumed.message).toContain("resources/r1");
    await journalEmptied(journal);
  });

  it("a clean-up retire's retry pauses are jittered (equal jitter, from the clock's random source)", async () => {
    const { engine, fake, clock } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    fake.set("model", "m1", "restore", { error: "deadline_exceeded" });
    fake.set("resources", "r1", "retire", { error: "internal_error" });
    const sentAt: number[] = [];
    const request = fake.request.bind(fake);
    fake.request = (subject, body, options) => {
      const parts = subject.split(".");
      if (parts[6] === "r1" && parts[7] === "retire") sentAt.push(clock.now());
      return request(subject, body, options);
    };
    clock.random = () => 0; // the bottom of each draw: half the grown pause
    const start = clock.now();
    await refusal(engine.restore({ checkpoint_id: "base", deadline_ts: (start + 2000) / 1000, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    const pauses = sentAt.slice(1).map((at, i) => at - sentAt[i]!);
    expect(pauses.slice(0, 7)).toEqual([50, 100, 200, 400, 800, 1600, 2500]);
  });

  it("a clean-up retire that failed unreachable at a participant the registry no longer lists (down for good) is not sent again, and restore_failed names it", async () => {
    const { engine, fake, clock, membership } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    fake.calls.length = 0;
    fake.set("model", "m1", "restore", { error: "deadline_exceeded" });
    fake.set("resources", "r1", "retire", "unreachable");
    membership.leave({ kind: "resources", instance: "r1" }); // heartbeat lapsed (a restore goes to checkpoint.json's participants all the same)
    const start = clock.now();
    const error = await refusal(engine.restore({ checkpoint_id: "base", deadline_ts: (start + 2000) / 1000, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(error.code).toBe("restore_failed");
    expect(error.message).toMatch(/^attempt\+1 could not be retired at resources\/r1 \(unreachable: [^)]*\) \(not in the membership registry any more/);
    expect(fake.ops("retire").filter((c) => c.instance === "r1")).toHaveLength(1);
    expect(fake.ops("resume")).toHaveLength(5);
    expect(clock.now()).toBe(start); // nothing sent again, no pause
  });

  it("a scope naming attempt MAX_ATTEMPT (it has no next attempt) is invalid_request with nothing journaled or sent: the clean-up's resume would fence the checkpoint at every participant", async () => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    fake.calls.length = 0;
    fake.events.length = 0;
    const last = { rollout_id: "r1", attempt: MAX_ATTEMPT };
    const error = await refusal(engine.restore({ checkpoint_id: "base", episode_ids: [{ rollout_id: "r0", attempt: 0 }, last] }));
    expect(error.code).toBe("invalid_request");
    expect(error.message).toContain(`attempt ${MAX_ATTEMPT}`);
    expect(fake.events).toEqual([]); // no journal write, no message
    expect(journal.entries.size).toBe(0);
    expect(engine.openCheckpoint).toBeNull();
    // Nothing was fenced: the same checkpoint restores with a scope one below.
    const reply = await engine.restore({ checkpoint_id: "base", episode_ids: [{ rollout_id: "r1", attempt: MAX_ATTEMPT - 1 }] });
    expect(reply.participants.every((p) => p.restored?.[0] === `r1-a${MAX_ATTEMPT}`)).toBe(true);
    await engine.resume({ checkpoint_id: "base" });
  });

  it("on a refusal, attempt+1 is retired everywhere except at the participant that refused (it installed nothing)", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    fake.calls.length = 0;
    fake.set("model", "m1", "restore", { error: "invalid_checkpoint_state" });
    const error = await refusal(engine.restore({ checkpoint_id: "base", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(error.code).toBe("restore_failed");
    expect(fake.ops("retire").map((c) => `${c.kind}/${c.instance}`).sort()).toEqual(["agent/a1", "agent/a2", "environment/e1", "resources/r1"]);
    expect(fake.ops("resume")).toHaveLength(5);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("a participant whose restore timed out and then had no responders may have installed attempt+1: it is retired there too", async () => {
    // A NATS restart: the first try reached m1 (it installed) but its reply was lost; the retry
    // finds m1 not yet resubscribed. The first try's outcome is still unknown, not a refusal.
    const { engine, fake } = makeEngine(root, { attemptTimeoutMs: 1000 });
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    fake.calls.length = 0;
    const request = fake.request.bind(fake);
    let tries = 0;
    fake.request = async (subject, body, options) => {
      if (!subject.endsWith(".model.m1.restore")) return request(subject, body, options);
      if (++tries === 1) {
        await request(subject, body, options); // installed there
        throw new RequestTimeoutFailure(subject, options.timeoutMs);
      }
      throw new NoRespondersFailure(subject);
    };
    const error = await refusal(engine.restore({ checkpoint_id: "base", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(error.code).toBe("restore_failed");
    expect(error.message).toContain("model/m1: outcome_unknown");
    expect(tries).toBe(2);
    expect(fake.ops("retire").map((c) => `${c.kind}/${c.instance}`).sort()).toEqual(["agent/a1", "agent/a2", "environment/e1", "model/m1", "resources/r1"]);
    expect(fake.ops("resume")).toHaveLength(5);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("a failed restore whose restore_cleanup entry cannot be written (a KV timeout) still retires attempt+1 and resumes everyone", async () => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    fake.calls.length = 0;
    const record = journal.record.bind(journal);
    journal.record = async (entry) => {
      if (entry.state === "restore_cleanup") throw new Error("KV timeout (scripted)");
      await record(entry);
    };
    fake.set("model", "m1", "restore", { error: "deadline_exceeded" });
    const error = await refusal(engine.restore({ checkpoint_id: "base", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(error.code).toBe("restore_failed");
    expect(fake.ops("retire")).toHaveLength(5);
    expect(fake.ops("resume")).toHaveLength(5);
    expect(engine.openCheckpoint).toBeNull();
    // the controller's resume is not taken for a plain abort's success
    expect((await refusal(engine.resume({ checkpoint_id: "base" }))).code).toBe("restore_failed");
    await journalEmptied(journal);
  });

  it("a restore that succeeded everywhere but whose restored entry cannot be written (a KV timeout) answers its reply, and is resumed as usual", async () => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    const record = journal.record.bind(journal);
    let failing = true;
    journal.record = async (entry) => {
      if (failing && entry.state === "restored") throw new Error("KV timeout (scripted)");
      await record(entry);
    };
    const request = { checkpoint_id: "base", episode_ids: [{ rollout_id: "r1", attempt: 0 }] };
    // The journal still says `restoring`: a successor re-sends it and gets it from the participants' reply caches.
    const reply = await engine.restore(request);
    expect(reply.participants.every((p) => p.restored?.[0] === "r1-a1")).toBe(true);
    expect(journal.entries.get("base")?.state).toBe("restoring");
    await expect(engine.restore(request)).resolves.toEqual(reply); // a retry gets it again
    failing = false;
    await engine.resume({ checkpoint_id: "base" });
    expect(fake.ops("retire")).toHaveLength(0);
    expect(engine.openCheckpoint).toBeNull();
    await journalEmptied(journal);
  });

  it("a successful restore leaves everyone restored until resume; retire must name it", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    const reply = await engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(reply.checkpoint_id).toBe("base");
    expect(reply.participants.every((p) => p.restored?.[0] === "r1-a1")).toBe(true);
    expect(engine.openCheckpoint?.phase).toBe("restored");
    expect((await refusal(engine.retire({ checkpoint_id: "other", episode_ids: [{ rollout_id: "r9", attempt: 0 }] }))).code).toBe("checkpoint_conflict");
    await engine.retire({ episode_ids: [{ rollout_id: "r9", attempt: 0 }] });
    expect(fake.ops("retire").every((c) => c.body.checkpoint_id === "base")).toBe(true);
    await engine.resume({ checkpoint_id: "base" });
    expect(engine.openCheckpoint).toBeNull();
  });

  it("retire and forget in a restored checkpoint taken before an expected participant joined: it is registered, so not reported missing", async () => {
    await makeEngine(root).engine.checkpoint({ checkpoint_id: "before-r2", episode_ids: null, stop: false, controller_state: null });
    const r2 = { kind: "resources" as const, instance: "r2" };
    const { engine, fake } = makeEngine(root, { members: [...FOUR_KINDS, r2], expected: [...FOUR_KINDS, r2] });
    await engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(engine.openCheckpoint?.phase).toBe("restored");
    await engine.retire({ episode_ids: [{ rollout_id: "r9", attempt: 0 }] });
    await engine.forget({ rollout_ids: ["r9"] });
    // the restored checkpoint's members, and r2: registered, it may serve the retired attempt
    expect(fake.ops("retire")).toHaveLength(FOUR_KINDS.length + 1);
    await engine.resume({ checkpoint_id: "before-r2" });
  });

  it("retire and forget in a restored checkpoint reach a registered participant the checkpoint lacks (it may still serve the retired attempt), callers before callees; its resume does not", async () => {
    await makeEngine(root).engine.checkpoint({ checkpoint_id: "before-a3", episode_ids: null, stop: false, controller_state: null });
    // a3 joined after that checkpoint and kept running: it was never restored, and is idle
    const a3 = { kind: "agent" as const, instance: "a3" };
    const { engine, fake } = makeEngine(root, { members: [...FOUR_KINDS, a3] });
    await engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(fake.ops("restore").map((c) => c.instance)).not.toContain("a3");
    const retired = await engine.retire({ episode_ids: [{ rollout_id: "old", attempt: 0 }] });
    expect(retired.participants.map((p) => `${p.kind}/${p.instance}`)).toContain("agent/a3");
    const retires = fake.ops("retire");
    expect(retires.map((c) => `${c.kind}/${c.instance}`).sort()).toEqual(["agent/a1", "agent/a2", "agent/a3", "environment/e1", "model/m1", "resources/r1"]);
    expectStaged(retires, STAGE.retire!);
    for (const c of retires) expect(c.body.checkpoint_id).toBe("before-a3");
    const forgotten = await engine.forget({ rollout_ids: ["old"] });
    expect(forgotten.participants.map((p) => `${p.kind}/${p.instance}`)).toContain("agent/a3");
    expect(fake.ops("forget")).toHaveLength(6);
    expectStaged(fake.ops("forget"), STAGE.retire!);
    await engine.resume({ checkpoint_id: "before-a3" });
    expect(fake.ops("resume").map((c) => c.instance)).not.toContain("a3"); // it never took part
  });
});

describe("HA hooks and recovery", () => {
  it("journals the decision before any commit and recovery re-drives a decided commit, then publishes and resumes", async () => {
    const crash = new Error("crash after decision");
    const first = makeEngine(root, { hooks: { afterDecision: () => Promise.reject(crash) } });
    await first.engine.prepare({ checkpoint_id: "c9" });
    await expect(first.engine.commit({ checkpoint_id: "c9", episode_ids: null, stop: false })).rejects.toBe(crash);
    expect(first.fake.ops("commit")).toHaveLength(0);
    const entry = first.journal.entries.get("c9")!;
    expect(entry.state).toBe("decided");
    // a successor with the same journal
    const second = makeEngine(root);
    // as the convenience op would have journaled it
    await second.journal.record({ ...entry, auto_publish: true });
    second.fake.calls.length = 0;
    const recovered = await second.engine.recover();
    expect(recovered).toEqual([{ checkpoint_id: "c9", action: "committed_published_resumed" }]);
    expect(second.fake.ops("commit")).toHaveLength(5);
    expect(second.fake.ops("resume")).toHaveLength(5);
    expect((await second.catalog.get("c9")).checkpoint_id).toBe("c9");
    await journalEmptied(second.journal);
  });

  it("recovery whose publication of a decided checkpoint fails withdraws the decision and resumes everyone, leaving nothing open", async () => {
    const second = makeEngine(root);
    await second.journal.record(
      journalEntry({ checkpoint_id: "c12", state: "decided", participants: second.fake.members, checkpoint_dir: join(root, "c12"), controller_state: { file: "gone.json" } }),
    );
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "c12", action: "publish_failed_resumed" }]);
    expect(second.fake.ops("commit")).toHaveLength(5);
    expect(second.fake.ops("resume")).toHaveLength(5);
    expect(second.engine.openCheckpoint).toBeNull();
    expect(second.journal.log.filter((e) => e.op === "record").map((e) => e.state)).toEqual(["decided", "decided", "open"]);
    await journalEmptied(second.journal);
    expect((await second.engine.checkpoint({ checkpoint_id: "c13", episode_ids: null, stop: false, controller_state: null })).checkpoint_id).toBe("c13");
  });

  it("recovery of an undecided checkpoint resumes everyone (presumed abort)", async () => {
    const second = makeEngine(root);
    await second.journal.record(journalEntry({ checkpoint_id: "c10", state: "open", participants: second.fake.members }));
    expect(await second.engine.recover()).toEqual([{ checkpoint_id: "c10", action: "resumed" }]);
    expect(second.fake.ops("commit")).toHaveLength(0);
    expect(second.fake.ops("resume")).toHaveLength(5);
    await expect(second.catalog.get("c10")).rejects.toMatchObject({ code: "not_found" });
  });

  it("the open entry is written while the first stage prepares and acknowledged before the second stage", async () => {
    const { engine, fake, journal } = makeEngine(root);
    let acknowledge!: () => void;
    const record = journal.record.bind(journal);
    journal.record = async (entry) => {
      if (entry.state === "open") await new Promise<void>((resolve) => (acknowledge = resolve));
      await record(entry);
    };
    const prepared = engine.prepare({ checkpoint_id: "c19" });
    await waitUntil(() => fake.ops("prepare").length > 0, "the first stage's prepare");
    expect(fake.ops("prepare").map((c) => c.kind)).toEqual(["environment"]);
    for (let i = 0; i < 5; i++) await new Promise((resolve) => setImmediate(resolve)); // file reads (LATEST) included
    expect(fake.ops("prepare").map((c) => c.kind)).toEqual(["environment"]); // held until the entry is acknowledged
    acknowledge();
    expect((await prepared).prepared).toBe(true);
    expect(fake.ops("prepare").map((c) => c.kind)).toEqual(["environment", "model", "agent", "agent", "resources"]);
  });

  it("a failed open entry resumes the first stage and refuses the prepare", async () => {
    const { engine, fake, journal } = makeEngine(root);
    journal.record = async () => {
      throw new Error("kv unavailable");
    };
    await expect(engine.prepare({ checkpoint_id: "c21" })).rejects.toThrow("kv unavailable");
    expect(fake.ops("prepare").map((c) => c.kind)).toEqual(["environment"]);
    expect(fake.ops("resume").map((c) => `${c.kind}/${c.instance}`)).toHaveLength(5);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("recovery resumes participants prepared for a checkpoint no journal entry names", async () => {
    const { engine, fake } = makeEngine(root);
    fake.state.set("environment.e1", { phase: "prepared", checkpoint_id: "c20" });
    fake.state.set("model.m1", { phase: "preparing", checkpoint_id: "c20" });
    expect(await engine.recover()).toEqual([{ checkpoint_id: "c20", action: "resumed_unjournaled" }]);
    expect(fake.ops("resume").map((c) => `${c.kind}/${c.instance}`)).toEqual(["model/m1", "environment/e1"]);
    expect(fake.ops("resume").every((c) => c.body.checkpoint_id === "c20" && c.body.epoch === 7)).toBe(true);
    // idle participants were only asked for their status
    expect(await engine.recover()).toEqual([]);
  });

  it("a restore whose leadership is lost during its journal write leaves nothing open and sends nothing", async () => {
    const { engine, fake, journal, leadership } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    const record = journal.record.bind(journal);
    journal.record = async (entry) => {
      await record(entry);
      if (entry.state === "restoring") {
        leadership.demote();
        engine.leadershipLost();
      }
    };
    // The entry was written, so a successor cleans up after it: not "nothing happened" (not_leader).
    expect((await refusal(engine.restore({ episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).code).toBe("outcome_unknown");
    expect(engine.openCheckpoint).toBeNull();
    expect(fake.ops("restore")).toHaveLength(0);
  });

  it("refuses a deadline further ahead than the protocol allows, sending nothing", async () => {
    const { engine, fake } = makeEngine(root);
    expect((await refusal(engine.prepare({ checkpoint_id: "far", deadline_ts: Date.now() }))).code).toBe("invalid_request"); // ms as s
    expect(fake.calls).toHaveLength(0);
    expect(engine.openCheckpoint).toBeNull();
  });

  it("leadership lost after an op began is outcome_unknown, not not_leader (which clients retry as if nothing happened)", async () => {
    let demote = () => {};
    const { engine, fake, journal, leadership } = makeEngine(root, { hooks: { afterDecision: async () => demote() } });
    demote = () => leadership.demote();
    const error = await refusal(engine.checkpoint({ checkpoint_id: "c70", episode_ids: null, stop: false, controller_state: null }));
    expect(error.code).toBe("outcome_unknown");
    expect(error.message).toContain("c70");
    expect(journal.entries.get("c70")?.state).toBe("decided"); // a successor completes it
    expect(fake.ops("commit")).toHaveLength(0);
  });

  it("leadership lost while every commit is in flight (all then answer ok) is outcome_unknown: the decided entry stays for a successor to complete", async () => {
    const { engine, fake, journal, leadership } = makeEngine(root);
    const request = fake.request.bind(fake);
    fake.request = async (subject, body, options) => {
      const reply = request(subject, body, options);
      // The lease is lost (a KV timeout on renewal) once the last commit left: every commit still succeeds.
      if (subject.endsWith(".commit") && fake.ops("commit").length === fake.members.length) {
        leadership.demote();
        engine.leadershipLost();
      }
      return reply;
    };
    const error = await refusal(engine.checkpoint({ checkpoint_id: "c71", episode_ids: null, stop: false, controller_state: null }));
    expect(error.code).toBe("outcome_unknown");
    expect(fake.ops("commit")).toHaveLength(5);
    expect(journal.entries.get("c71")?.state).toBe("decided"); // a successor completes it
  });

  for (const op of ["prepare", "checkpoint"] as const) {
    it(`leadership lost during ${op}'s stages is outcome_unknown, not an incomplete prepare (a successor aborts it, not this one)`, async () => {
      const { engine, fake, leadership } = makeEngine(root);
      // The model's prepare times out while this coordinator is deposed (e.g. it was frozen): the
      // retry's leadership guard ends that call with not_leader, a per-participant result.
      fake.set("model", "m1", "prepare", "timeout");
      const request = fake.request.bind(fake);
      fake.request = async (subject, body, options) => {
        if (subject.endsWith(".model.m1.prepare")) leadership.demote();
        return request(subject, body, options);
      };
      const error = await refusal(op === "prepare" ? engine.prepare({ checkpoint_id: "lost-mid" }) : engine.checkpoint({ checkpoint_id: "lost-mid", episode_ids: null, stop: false, controller_state: null }));
      expect(error.code).toBe("outcome_unknown");
      expect(fake.ops("prepare").map((c) => c.instance)).toEqual(["e1", "m1"]); // stages after it never start
      expect(fake.ops("resume")).toHaveLength(0); // the deposed leader aborts nothing
    });
  }

  it("a demoted coordinator sends nothing more, and journals nothing", async () => {
    const { engine, fake, leadership, journal } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "c11" });
    leadership.demote();
    const sent = fake.calls.length;
    expect((await refusal(engine.commit({ checkpoint_id: "c11", episode_ids: null, stop: false }))).code).toBe("not_leader");
    expect(fake.ops("commit")).toHaveLength(0);
    expect(fake.calls.length).toBe(sent);
    expect(journal.entries.get("c11")?.state).toBe("open");
  });
});

describe("the checkpoint op on an id a prepare of its own opened", () => {
  it("is refused checkpoint_conflict, nothing sent or journaled; that checkpoint still commits, publishes and resumes as its controller drives it", async () => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "m1" });
    const sent = fake.calls.length;
    const journaled = journal.log.length;
    const refused = await refusal(engine.checkpoint({ checkpoint_id: "m1", episode_ids: null, stop: false, controller_state: { inline: { step: 1 } } }));
    expect(refused.code).toBe("checkpoint_conflict");
    expect(fake.calls.length).toBe(sent);
    expect(journal.log.length).toBe(journaled);
    await engine.commit({ checkpoint_id: "m1", episode_ids: null, stop: false });
    await engine.publish({ checkpoint_id: "m1", controller_state: null });
    await engine.resume({ checkpoint_id: "m1" });
    expect((await engine.list()).latest).toBe("m1");
  });
});

describe("renew", () => {
  it("goes to every participant at once and needs an open checkpoint", async () => {
    const { engine, fake } = makeEngine(root);
    expect((await refusal(engine.renew({ checkpoint_id: "r1" }))).code).toBe("not_found");
    await engine.prepare({ checkpoint_id: "r1" });
    const reply = await engine.renew({ checkpoint_id: "r1" });
    expect(reply.participants).toHaveLength(5);
    expect(fake.ops("renew")).toHaveLength(5);
  });

  it("of a prepare that stopped at a stage goes to the stages it reached, not to the idle members after it (they would refuse it)", async () => {
    const { engine, fake } = makeEngine(root);
    fake.set("model", "m1", "prepare", { notReady: ["r7"] });
    expect((await engine.prepare({ checkpoint_id: "r2" })).stopped_at).toEqual(["model"]);
    const reply = await engine.renew({ checkpoint_id: "r2" });
    expect(reply.participants.map((p) => `${p.kind}/${p.instance}`).sort()).toEqual(["environment/e1", "model/m1"]);
    expect(fake.ops("renew").map((c) => c.kind).sort()).toEqual(["environment", "model"]);
    // Prepared everywhere once the model is ready: every member again.
    fake.set("model", "m1", "prepare", "ok");
    expect((await engine.prepare({ checkpoint_id: "r2" })).prepared).toBe(true);
    expect((await engine.renew({ checkpoint_id: "r2" })).participants).toHaveLength(5);
  });

  it("after a re-driven prepare stops at an earlier stage, still reaches the later stages an earlier prepare left parked (their leases must not lapse)", async () => {
    const { engine, fake } = makeEngine(root);
    expect((await engine.prepare({ checkpoint_id: "r3" })).prepared).toBe(true);
    fake.set("environment", "e1", "prepare", { notReady: ["r8"] });
    expect((await engine.prepare({ checkpoint_id: "r3" })).stopped_at).toEqual(["environment"]);
    expect((await engine.renew({ checkpoint_id: "r3" })).participants).toHaveLength(5);
    expect(fake.ops("renew")).toHaveLength(5);
  });
});

describe("stop", () => {
  it("the convenience op with stop publishes and leaves everyone parked (no resume), then closes the checkpoint", async () => {
    const { engine, fake, catalog, journal } = makeEngine(root);
    const reply = await engine.checkpoint({ checkpoint_id: "last", episode_ids: null, stop: true, controller_state: null });
    expect(reply.participants).toBe(5);
    expect(fake.ops("commit").every((c) => c.body.stop === true)).toBe(true);
    expect(fake.ops("resume")).toHaveLength(0);
    expect((await catalog.get("last")).stop).toBe(true);
    expect(engine.openCheckpoint).toBeNull();
    await journalEmptied(journal);
  });

  it("losing leadership drops the in-memory open checkpoint (the journal is the truth)", async () => {
    const { engine, journal } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "lost" });
    engine.leadershipLost();
    expect(engine.openCheckpoint).toBeNull();
    expect(journal.entries.get("lost")?.state).toBe("open");
  });
});
