import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { refusalOf } from "../../support/refusal.js";
import { FOUR_KINDS, journalEmptied, makeEngine, writers } from "./fake-participants.js";

/**
 * docs/api.md resume: a resume that failed at some participants closes the checkpoint (they resume
 * when their lease expires), and a retry of it sends the resume again to those of them that may
 * still hold it. Before, the retry of a closed id answered success with no participants and sent
 * nothing: a controller retrying to release a participant parked by a lost resume was told it had.
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-resume-retry-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const resumesTo = (calls: { kind: string; instance: string }[]) => calls.map((c) => `${c.kind}/${c.instance}`);

describe("a resume retried after it failed at a participant", () => {
  it("sends the resume again to that participant only, and answers its outcome", async () => {
    const { engine, fake, clock } = makeEngine(root);
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.prepare({ checkpoint_id: "c1", deadline_ts });
    fake.set("model", "m1", "resume", "unreachable");
    expect(await refusalOf(engine.resume({ checkpoint_id: "c1", deadline_ts }))).toMatchObject({ code: "unreachable" });
    expect(fake.state.get("model.m1")).toMatchObject({ phase: "prepared", checkpoint_id: "c1" });

    // Still unreachable: the retry fails the same way, not success.
    fake.set("model", "m1", "status", "unreachable");
    const before = fake.ops("resume").length;
    expect(await refusalOf(engine.resume({ checkpoint_id: "c1", deadline_ts }))).toMatchObject({ code: "unreachable" });
    expect(resumesTo(fake.ops("resume").slice(before))).toEqual(["model/m1"]);

    // Reachable again: the retry resumes it, and only it.
    fake.set("model", "m1", "resume", "ok");
    fake.set("model", "m1", "status", "ok");
    const again = fake.ops("resume").length;
    const reply = await engine.resume({ checkpoint_id: "c1", deadline_ts });
    expect(reply.participants.map((p) => `${p.kind}/${p.instance}`)).toEqual(["model/m1"]);
    expect(resumesTo(fake.ops("resume").slice(again))).toEqual(["model/m1"]);
    expect(fake.state.get("model.m1")).toMatchObject({ phase: "idle" });

    // Once it resumed, a further retry is the ordinary idempotent one: nothing sent, even past its deadline.
    clock.current += 70_000;
    const last = fake.ops("resume").length;
    await expect(engine.resume({ checkpoint_id: "c1", deadline_ts })).resolves.toEqual({ checkpoint_id: "c1", participants: [] });
    expect(fake.ops("resume").length).toBe(last);
  });

  it("one its lease resumed meanwhile gets nothing: success with no participants", async () => {
    const { engine, fake, clock } = makeEngine(root);
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.prepare({ checkpoint_id: "c2", deadline_ts });
    fake.set("agent", "a1", "resume", "unreachable");
    expect(await refusalOf(engine.resume({ checkpoint_id: "c2", deadline_ts }))).toMatchObject({ code: "unreachable" });
    fake.state.set("agent.a1", { phase: "idle", checkpoint_id: null }); // its lease expired
    const before = fake.ops("resume").length;
    await expect(engine.resume({ checkpoint_id: "c2", deadline_ts })).resolves.toEqual({ checkpoint_id: "c2", participants: [] });
    expect(fake.ops("resume").length).toBe(before);
  });

  it("a checkpoint op's resume_failures: a later resume of its id releases them", async () => {
    const { engine, fake, clock, journal } = makeEngine(root);
    fake.set("resources", "r1", "resume", "unreachable");
    const done = await engine.checkpoint({ checkpoint_id: "c3", episode_ids: null, stop: false, controller_state: null });
    expect(done.resume_failures.map((f) => `${f.kind}/${f.instance}:${f.code}`)).toEqual(["resources/r1:unreachable"]);
    await journalEmptied(journal);
    fake.set("resources", "r1", "resume", "ok");
    const before = fake.ops("resume").length;
    const reply = await engine.resume({ checkpoint_id: "c3", deadline_ts: clock.now() / 1000 + 60 });
    expect(reply.participants.map((p) => `${p.kind}/${p.instance}`)).toEqual(["resources/r1"]);
    expect(resumesTo(fake.ops("resume").slice(before))).toEqual(["resources/r1"]);
  });

  it("control: a resume that succeeded everywhere, retried, sends nothing", async () => {
    const { engine, fake, clock } = makeEngine(root);
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.prepare({ checkpoint_id: "c4", deadline_ts });
    await engine.resume({ checkpoint_id: "c4", deadline_ts });
    const before = fake.calls.length;
    await expect(engine.resume({ checkpoint_id: "c4", deadline_ts })).resolves.toEqual({ checkpoint_id: "c4", participants: [] });
    expect(fake.calls.length).toBe(before);
  });
});

/**
 * The participants a resume failed at are this term's memory, as the restore ids whose resume this
 * term finished are (leadershipLost): a successor may have run the restore's clean-up meanwhile
 * (attempt+1 retired everywhere, everyone resumed, entry removed). Before, the previous term's list
 * survived the loss, so the controller's retry after a regain found nobody holding the id and
 * answered success with no participants: the controller would continue rollouts whose attempt+1
 * the successor retired.
 */
describe("a restore's resume that failed at a participant, retried after leadership was lost and regained", () => {
  it("is not answered success from the previous term's memory", async () => {
    const { engine, fake, journal, clock } = makeEngine(root, { requireRecovery: true });
    await engine.recover();
    await engine.checkpoint({ checkpoint_id: "rx", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.restore({ checkpoint_id: "rx", deadline_ts, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    fake.set("model", "m1", "resume", "unreachable");
    // the entry's removal fails until leadership is lost
    const remove = journal.remove.bind(journal);
    let failing = true;
    journal.remove = async (id) => {
      if (failing) {
        engine.leadershipLost();
        throw new Error("journal timeout (scripted)");
      }
      return remove(id);
    };
    // (a failure either way: m1 unreachable, the term ending before the entry went)
    expect(await refusalOf(engine.resume({ checkpoint_id: "rx", deadline_ts }))).toMatchObject({ code: expect.stringMatching(/unreachable|outcome_unknown/) });
    expect(fake.state.get("model.m1")).toMatchObject({ checkpoint_id: "rx" });
    // A successor ran the restore's clean-up (m1 resumed too) and removed the entry; then this
    // coordinator became the leader again.
    failing = false;
    await remove("rx");
    fake.set("model", "m1", "resume", "ok");
    fake.state.set("model.m1", { phase: "idle", checkpoint_id: null });
    await engine.recover();
    const retry = await engine.resume({ checkpoint_id: "rx", deadline_ts }).then(
      (reply) => ({ ok: true as const, reply }),
      (error: { code: string }) => ({ ok: false as const, code: error.code }),
    );
    expect(retry).not.toMatchObject({ ok: true });
  });
});

/**
 * docs/api.md restore: a published checkpoint whose resume never reached a participant (still
 * parked in it) is refused `invalid_phase` before anything is sent, "resume it before a restore",
 * as one whose controller never resumed it is. Before, such a checkpoint closed with its resume
 * failures was restored anyway: the parked participant refused, so the restore failed, and its
 * clean-up resumed everyone and fenced the id (restore_failed; a retried resume answered that too).
 */
describe("a restore of a checkpoint whose resume failed at a participant still parked in it", () => {
  it("is refused invalid_phase, nothing sent; once the resume is retried, the restore goes ahead", async () => {
    const { engine, fake, clock, journal } = makeEngine(root);
    fake.set("model", "m1", "resume", "unreachable");
    const done = await engine.checkpoint({ checkpoint_id: "c5", episode_ids: null, stop: false, controller_state: null });
    expect(done.resume_failures.map((f) => `${f.kind}/${f.instance}`)).toEqual(["model/m1"]);
    await journalEmptied(journal);
    fake.set("model", "m1", "resume", "ok");
    fake.set("model", "m1", "restore", { error: "invalid_phase" }); // as a parked participant answers
    const deadline_ts = clock.now() / 1000 + 60;
    const sent = fake.calls.filter((c) => c.op !== "status").length;
    const refused = await refusalOf(engine.restore({ checkpoint_id: "c5", deadline_ts, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }));
    expect(refused).toMatchObject({ code: "invalid_phase", message: expect.stringContaining("model/m1") });
    expect(fake.calls.filter((c) => c.op !== "status").length).toBe(sent);
    expect(journal.entries.size).toBe(0);
    // The controller resumes it as told: m1 is released, and nothing else was fenced by a restore.
    const reply = await engine.resume({ checkpoint_id: "c5", deadline_ts });
    expect(reply.participants.map((p) => `${p.kind}/${p.instance}`)).toEqual(["model/m1"]);
  });
});

/**
 * The resume sent again goes to the process it failed at, as the first one did (its incarnation):
 * a process started since holds nothing of the checkpoint, and a resume would fence the id there,
 * so the restore of it (LATEST, after a crash) that fresh process is for would be refused. Before,
 * the retry went to whichever process answered the subject, the new one included.
 */
describe("a resume retried after the participant it failed at restarted", () => {
  it("sends nothing to the new process (the view shows the restart), and answers success", async () => {
    const incarnations = new Map(FOUR_KINDS.map((m) => [`${m.kind}.${m.instance}`, `${m.instance}-1`]));
    const { engine, fake, clock, membership } = makeEngine(root, { incarnations });
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.prepare({ checkpoint_id: "c6", deadline_ts });
    fake.set("model", "m1", "resume", "unreachable");
    expect(await refusalOf(engine.resume({ checkpoint_id: "c6", deadline_ts }))).toMatchObject({ code: "unreachable" });
    // Its supervisor restarted it; the new process does not answer its status yet.
    membership.announce({ kind: "model", instance: "m1" }, "m1-2");
    fake.set("model", "m1", "status", "unreachable");
    fake.set("model", "m1", "resume", "ok");
    const before = fake.ops("resume").length;
    await expect(engine.resume({ checkpoint_id: "c6", deadline_ts })).resolves.toMatchObject({ checkpoint_id: "c6" });
    expect(resumesTo(fake.ops("resume").slice(before))).toEqual([]);
  });

  it("one the view does not show restarted yet gets the resume addressed to the process it failed at", async () => {
    const incarnations = new Map(FOUR_KINDS.map((m) => [`${m.kind}.${m.instance}`, `${m.instance}-1`]));
    const { engine, fake, clock } = makeEngine(root, { incarnations });
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.prepare({ checkpoint_id: "c7", deadline_ts });
    fake.set("model", "m1", "resume", "unreachable");
    expect(await refusalOf(engine.resume({ checkpoint_id: "c7", deadline_ts }))).toMatchObject({ code: "unreachable" });
    fake.set("model", "m1", "resume", "ok");
    fake.set("model", "m1", "status", "unreachable");
    const before = fake.ops("resume").length;
    await engine.resume({ checkpoint_id: "c7", deadline_ts });
    expect(fake.ops("resume").slice(before).map((c) => c.body.incarnation)).toEqual(["m1-1"]);
  });
});

describe("a checkpoint's resume that failed at a participant, retried after leadership was lost and regained", () => {
  it("asks every participant, as for an id this term never closed: the one still parked is resumed", async () => {
    const { engine, fake, journal, clock } = makeEngine(root, { requireRecovery: true });
    await engine.recover();
    fake.set("model", "m1", "resume", "unreachable");
    const done = await engine.checkpoint({ checkpoint_id: "c8", episode_ids: null, stop: false, controller_state: null });
    expect(done.resume_failures.map((f) => `${f.kind}/${f.instance}`)).toEqual(["model/m1"]);
    await journalEmptied(journal);
    engine.leadershipLost();
    await engine.recover();
    fake.set("model", "m1", "resume", "ok");
    const before = fake.ops("resume").length;
    const reply = await engine.resume({ checkpoint_id: "c8", deadline_ts: clock.now() / 1000 + 60 });
    expect(reply.participants.map((p) => `${p.kind}/${p.instance}`)).toEqual(["model/m1"]);
    expect(resumesTo(fake.ops("resume").slice(before))).toEqual(["model/m1"]);
    // Closed by that resume in this term: a further retry is the ordinary idempotent one.
    const last = fake.ops("resume").length;
    await expect(engine.resume({ checkpoint_id: "c8", deadline_ts: clock.now() / 1000 + 60 })).resolves.toEqual({ checkpoint_id: "c8", participants: [] });
    expect(fake.ops("resume").length).toBe(last);
  });
});

/**
 * The same for an id this coordinator closed without any failure: a successor may have restored it
 * since (it is LATEST: the checkpoint a restarted trainer restores), and that restore's resume
 * failed at a participant still parked in it, which only that successor's memory knew. Answering
 * the controller's retry "resumed" from the previous term's closed ids left that participant
 * parked until its lease expired (every prepare refused there meanwhile).
 */
describe("a checkpoint closed here, restored by a successor whose resume failed at a participant, resumed after leadership came back", () => {
  it("resumes the participant still holding it, not success from the previous term's memory", async () => {
    const first = makeEngine(root, { requireRecovery: true });
    await first.engine.recover();
    await first.engine.checkpoint({ checkpoint_id: "c9", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(first.journal);
    first.engine.leadershipLost();
    // The successor: the trainer restarted and restored LATEST; its resume failed at m1.
    const second = makeEngine(root, { requireRecovery: true, successorOf: first, epoch: 8 });
    await second.engine.recover();
    const deadline_ts = first.clock.now() / 1000 + 60;
    await second.engine.restore({ checkpoint_id: "c9", deadline_ts, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    first.fake.set("model", "m1", "resume", "unreachable");
    expect((await refusalOf(second.engine.resume({ checkpoint_id: "c9", deadline_ts }))).code).toBe("unreachable");
    await journalEmptied(first.journal);
    expect(first.fake.state.get("model.m1")).toMatchObject({ checkpoint_id: "c9" });
    // The successor lost the lease; this coordinator leads again, and the controller retries the resume here.
    second.engine.leadershipLost();
    await first.engine.recover();
    first.fake.set("model", "m1", "resume", "ok");
    const before = first.fake.ops("resume").length;
    const reply = await first.engine.resume({ checkpoint_id: "c9", deadline_ts });
    expect(resumesTo(first.fake.ops("resume").slice(before))).toEqual(["model/m1"]);
    expect(reply.participants.map((p) => `${p.kind}/${p.instance}`)).toEqual(["model/m1"]);
    expect(first.fake.state.get("model.m1")?.checkpoint_id ?? null).toBeNull();
  });
});

/**
 * docs/api.md resume: a retry "sends the resume again to the participants it failed at". That holds
 * for a failed restore's clean-up too, whose resume failed at a participant still parked in the
 * restore: the retried resume answers `restore_failed` as before, and releases it. Before, it
 * answered `restore_failed` with nothing sent, and that participant stayed parked until its lease
 * expired (every prepare refused there meanwhile), whatever the controller did.
 */
describe("a restore cleaned up whose clean-up's resume failed at a participant, resumed again", () => {
  it("answers restore_failed and sends the resume again to that participant", async () => {
    const { engine, fake, clock } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "c10", episode_ids: null, stop: true, controller_state: null });
    const deadline_ts = clock.now() / 1000 + 60;
    fake.set("environment", "e1", "restore", { error: "storage_error" });
    fake.set("model", "m1", "resume", "unreachable");
    expect((await refusalOf(engine.restore({ checkpoint_id: "c10", deadline_ts, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).code).toBe("restore_failed");
    expect(fake.state.get("model.m1")).toMatchObject({ checkpoint_id: "c10" });
    fake.set("model", "m1", "resume", "ok");
    const before = fake.ops("resume").length;
    // A deadline of its own: the clean-up's resends (and a recovery finishing its clean-up) may use the restore's up.
    expect((await refusalOf(engine.resume({ checkpoint_id: "c10", deadline_ts: clock.now() / 1000 + 60 }))).code).toBe("restore_failed");
    expect(resumesTo(fake.ops("resume").slice(before))).toEqual(["model/m1"]);
    expect(fake.state.get("model.m1")?.checkpoint_id ?? null).toBeNull();
    // Released: a further retry sends nothing, and answers the same.
    const last = fake.ops("resume").length;
    expect((await refusalOf(engine.resume({ checkpoint_id: "c10", deadline_ts: clock.now() / 1000 + 60 }))).code).toBe("restore_failed");
    expect(fake.ops("resume").length).toBe(last);
  });
});

describe("a restore cleaned up whose clean-up's resume failed at a participant, resumed after leadership was lost and regained", () => {
  it("answers restore_failed and resumes the participant still holding it (the previous term's list of failures is gone)", async () => {
    const { engine, fake, clock } = makeEngine(root, { requireRecovery: true });
    await engine.recover();
    await engine.checkpoint({ checkpoint_id: "c11", episode_ids: null, stop: true, controller_state: null });
    const deadline_ts = clock.now() / 1000 + 60;
    fake.set("environment", "e1", "restore", { error: "storage_error" });
    fake.set("model", "m1", "resume", "unreachable");
    expect((await refusalOf(engine.restore({ checkpoint_id: "c11", deadline_ts, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).code).toBe("restore_failed");
    expect(fake.state.get("model.m1")).toMatchObject({ checkpoint_id: "c11" });
    engine.leadershipLost();
    await engine.recover();
    fake.set("model", "m1", "resume", "ok");
    const before = fake.ops("resume").length;
    // A deadline of its own: the clean-up's resends (and a recovery finishing its clean-up) may use the restore's up.
    expect((await refusalOf(engine.resume({ checkpoint_id: "c11", deadline_ts: clock.now() / 1000 + 60 }))).code).toBe("restore_failed");
    expect(resumesTo(fake.ops("resume").slice(before))).toEqual(["model/m1"]);
    expect(fake.state.get("model.m1")?.checkpoint_id ?? null).toBeNull();
  });
});

/**
 * A restore this coordinator cleaned up (restore_failed remembered), restored again by a successor
 * that died before its resume; this coordinator leads again and re-drives the successor's journaled
 * restore. Before, its memory of the earlier failure answered the resume's retry (its reply lost)
 * with restore_failed, though this restore succeeded and was resumed: the controller would restart
 * from input rollouts the Gym continues as attempt+1.
 */
describe("a restore cleaned up here, restored by a successor, re-driven after leadership came back", () => {
  it("answers its resume's retry as resumed, not from the earlier failure", async () => {
    const first = makeEngine(root, { requireRecovery: true });
    await first.engine.recover();
    await first.engine.checkpoint({ checkpoint_id: "c12", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(first.journal);
    const scope = [{ rollout_id: "r1", attempt: 0 }];
    first.fake.set("environment", "e1", "restore", { error: "storage_error" });
    const deadline_ts = () => first.clock.now() / 1000 + 60;
    expect((await refusalOf(first.engine.restore({ checkpoint_id: "c12", deadline_ts: deadline_ts(), episode_ids: scope }))).code).toBe("restore_failed");
    await journalEmptied(first.journal);
    first.engine.leadershipLost();
    // The successor restores it again (fresh processes), and loses the lease before the resume.
    for (const m of FOUR_KINDS) first.fake.restart(m.kind, m.instance);
    first.fake.set("environment", "e1", "restore", "ok");
    const second = makeEngine(root, { requireRecovery: true, successorOf: first, epoch: 8 });
    await second.engine.recover();
    await second.engine.restore({ checkpoint_id: "c12", deadline_ts: deadline_ts(), episode_ids: scope });
    second.engine.leadershipLost();
    // This coordinator leads again: its recovery re-drives the journaled restore, and the controller resumes it.
    expect(await first.engine.recover()).toEqual([{ checkpoint_id: "c12", action: "restored" }]);
    await first.engine.resume({ checkpoint_id: "c12", deadline_ts: deadline_ts() });
    for (const m of FOUR_KINDS) expect(first.fake.state.get(`${m.kind}.${m.instance}`)?.checkpoint_id ?? null).toBeNull();
    // Its reply was lost: the retry is answered as the resume it repeats.
    await expect(first.engine.resume({ checkpoint_id: "c12", deadline_ts: deadline_ts() })).resolves.toEqual({ checkpoint_id: "c12", participants: [] });
  });
});

/**
 * A restore's outcome is kept durably by whichever leader settled it (the journal's removal of its
 * entry records it): a coordinator that led in an earlier term answers a resume's retry from that
 * record, not from what its own memory of that term says. Before, a restore this coordinator
 * cleaned up, restored again by a successor that resumed it (entry removed), was answered
 * `restore_failed` once leadership came back: the controller restarted from input rollouts the Gym
 * continues as attempt+1. And a restore the successor cleaned up was answered success (nobody held
 * the id): the controller continued rollouts whose attempt+1 the successor retired.
 */
describe("a restore settled by a successor, its resume retried after leadership came back", () => {
  const scope = [{ rollout_id: "r1", attempt: 0 }];

  it("restored and resumed there: answered as resumed, not from this coordinator's earlier clean-up", async () => {
    const first = makeEngine(root, { requireRecovery: true });
    await first.engine.recover();
    await first.engine.checkpoint({ checkpoint_id: "c13", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(first.journal);
    const deadline_ts = () => first.clock.now() / 1000 + 60;
    first.fake.set("environment", "e1", "restore", { error: "storage_error" });
    expect((await refusalOf(first.engine.restore({ checkpoint_id: "c13", deadline_ts: deadline_ts(), episode_ids: scope }))).code).toBe("restore_failed");
    await journalEmptied(first.journal);
    first.engine.leadershipLost();
    // The successor restores it again into fresh processes, resumes it, and removes its entry.
    for (const m of FOUR_KINDS) first.fake.restart(m.kind, m.instance);
    first.fake.set("environment", "e1", "restore", "ok");
    const second = makeEngine(root, { requireRecovery: true, successorOf: first, epoch: 8 });
    await second.engine.recover();
    await second.engine.restore({ checkpoint_id: "c13", deadline_ts: deadline_ts(), episode_ids: scope });
    await second.engine.resume({ checkpoint_id: "c13", deadline_ts: deadline_ts() });
    await journalEmptied(first.journal);
    second.engine.leadershipLost();
    // This coordinator leads again; the controller's resume (its reply from the successor lost) is retried here.
    expect(await first.engine.recover()).toEqual([]);
    const before = first.fake.ops("resume").length;
    // The journal unreadable: outcome_unknown, nothing sent, rather than a guess either way.
    const read = first.journal.restoreOutcome.bind(first.journal);
    first.journal.restoreOutcome = () => Promise.reject(new Error("journal timeout (scripted)"));
    expect((await refusalOf(first.engine.resume({ checkpoint_id: "c13", deadline_ts: deadline_ts() }))).code).toBe("outcome_unknown");
    first.journal.restoreOutcome = read;
    await expect(first.engine.resume({ checkpoint_id: "c13", deadline_ts: deadline_ts() })).resolves.toEqual({ checkpoint_id: "c13", participants: [] });
    expect(first.fake.ops("resume").length).toBe(before);
    // The checkpoint's own removal recorded no outcome (no write beyond the one every checkpoint makes); the restores' did.
    expect(first.journal.log.filter((l) => l.op === "remove" && l.checkpoint_id === "c13").map((l) => l.outcome ?? null)).toEqual([null, "restore_failed", "restored"]);
  });

  it("cleaned up there: answered restore_failed, not success from this coordinator's earlier close", async () => {
    const first = makeEngine(root, { requireRecovery: true });
    await first.engine.recover();
    await first.engine.checkpoint({ checkpoint_id: "c14", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(first.journal);
    first.engine.leadershipLost();
    const deadline_ts = () => first.clock.now() / 1000 + 60;
    const second = makeEngine(root, { requireRecovery: true, successorOf: first, epoch: 8 });
    await second.engine.recover();
    first.fake.set("environment", "e1", "restore", { error: "storage_error" });
    expect((await refusalOf(second.engine.restore({ checkpoint_id: "c14", deadline_ts: deadline_ts(), episode_ids: scope }))).code).toBe("restore_failed");
    await journalEmptied(first.journal);
    second.engine.leadershipLost();
    expect(await first.engine.recover()).toEqual([]);
    expect((await refusalOf(first.engine.resume({ checkpoint_id: "c14", deadline_ts: deadline_ts() }))).code).toBe("restore_failed");
  });
});
