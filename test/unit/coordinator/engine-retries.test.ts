import { existsSync, readFileSync } from "node:fs";
import { mkdir, mkdtemp, rm, symlink, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { MANIFEST_SCHEMA_VERSION, type Kind } from "../../../protocol/index.js";
import { DEFAULT_REPLY_SLACK_MS } from "../../../coordinator/client/reply-decoder.js";
import { CoordinatorConfigSchema } from "../../../coordinator/config/coordinator-config.js";
import { refusalOf } from "../../support/refusal.js";
import { journalEmptied, makeEngine, writeParticipant, writers } from "./fake-participants.js";

/**
 * The engine's answers to retries and reused ids: a retry whose reply was lost (its deadline_ts
 * past by then), after a release, a stop checkpoint, a lost and regained leadership; a fresh id
 * whose directory an earlier attempt left; a combined failure naming every participant.
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-engine-retries-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const R1 = [{ rollout_id: "r1", attempt: 0 }];

describe("a failed prepare answers while its controller still waits", () => {
  it("a participant stalled through prepare and the abort's resume: prepare_incomplete within deadline_ts + the clients' default slack", async () => {
    // The daemon's default request_slack_ms, and the clients' default wait past deadline_ts.
    const { request_slack_ms } = CoordinatorConfigSchema.parse({ token: "t", checkpoint_root: "/c" });
    const { engine, clock, fake } = makeEngine(root, { slackMs: request_slack_ms });
    // Every try times out (the test clock moves by the try's whole timeout): prepare at the last stage, then its resume.
    fake.set("resources", "r1", "prepare", "timeout");
    fake.set("resources", "r1", "resume", "timeout");
    const deadlineMs = clock.now() + 4000;
    await expect(engine.checkpoint({ checkpoint_id: "stall-1", deadline_ts: deadlineMs / 1000, episode_ids: null, stop: false, controller_state: null })).rejects.toMatchObject({
      code: "prepare_incomplete",
    });
    expect(fake.ops("resume").some((c) => c.kind === "resources")).toBe(true); // the abort tried it
    expect(clock.now()).toBeLessThanOrEqual(deadlineMs + DEFAULT_REPLY_SLACK_MS - 1000);
  });

  it("every participant stalled (a paused node): the abort's resume sends the stages left once its deadline passed at once, not one slack after another", async () => {
    const { request_slack_ms } = CoordinatorConfigSchema.parse({ token: "t", checkpoint_root: "/c" });
    const { engine, clock, fake } = makeEngine(root, { slackMs: request_slack_ms });
    fake.set("environment", "e1", "prepare", "timeout");
    for (const [kind, instance] of [["environment", "e1"], ["model", "m1"], ["agent", "a1"], ["resources", "r1"]] as const) fake.set(kind, instance, "resume", "timeout");
    const deadlineMs = clock.now() + 4000;
    await expect(engine.checkpoint({ checkpoint_id: "stall-all", deadline_ts: deadlineMs / 1000, episode_ids: null, stop: false, controller_state: null })).rejects.toMatchObject({
      code: "prepare_incomplete",
    });
    // Every stage was still sent, and resources (the first) before the others.
    const resumes = fake.ops("resume").map((c) => c.kind);
    expect(new Set(resumes)).toEqual(new Set(["resources", "agent", "model", "environment"]));
    expect(resumes[0]).toBe("resources");
    expect(clock.now()).toBeLessThanOrEqual(deadlineMs + DEFAULT_REPLY_SLACK_MS - 1000);
  });
});

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

  it("a deadline_ts more than 7 days ahead (milliseconds sent as seconds) is invalid_request on a retry answered from memory too, nothing sent", async () => {
    const { engine, clock, fake } = makeEngine(root);
    const msAsSeconds = clock.now();
    await engine.prepare({ checkpoint_id: "cap-1" });
    await engine.commit({ checkpoint_id: "cap-1", episode_ids: R1, stop: false });
    await engine.publish({ checkpoint_id: "cap-1", controller_state: null });
    await engine.resume({ checkpoint_id: "cap-1" });
    await engine.checkpoint({ checkpoint_id: "cap-2", episode_ids: R1, stop: false, controller_state: null });
    await engine.checkpoint({ checkpoint_id: "cap-3", episode_ids: R1, stop: false, controller_state: null });
    await engine.restore({ checkpoint_id: "cap-2", episode_ids: R1 });
    const sent = fake.calls.length;
    const answer = (work: Promise<unknown>) => work.then(() => "answered", (error: { code?: string }) => error.code);
    expect({
      commit: await answer(engine.commit({ checkpoint_id: "cap-1", deadline_ts: msAsSeconds, episode_ids: R1, stop: false })),
      resume: await answer(engine.resume({ checkpoint_id: "cap-1", deadline_ts: msAsSeconds })),
      checkpoint: await answer(engine.checkpoint({ checkpoint_id: "cap-3", deadline_ts: msAsSeconds, episode_ids: R1, stop: false, controller_state: null })),
      restore: await answer(engine.restore({ checkpoint_id: "cap-2", deadline_ts: msAsSeconds, episode_ids: R1 })),
    }).toEqual({ commit: "invalid_request", resume: "invalid_request", checkpoint: "invalid_request", restore: "invalid_request" });
    expect(fake.calls.length).toBe(sent);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "cap-2", phase: "restored" });
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

/**
 * docs/api.md, "Retrying a controller op": a `checkpoint` or `publish` whose reply was lost after it
 * finished is answered from its checkpoint.json when the retry names the arguments it records, by a
 * successor (the predecessor removed its journal entry once everyone resumed) and by the coordinator
 * that ran it once 8 later ids pushed its kept reply out; other arguments are refused as before.
 */
describe("a checkpoint or publish retried after it finished, its reply no longer kept", () => {
  const state = { inline: { step: 12, optimizer: "adam" } };

  it("a successor answers the checkpoint op from checkpoint.json (nothing sent); other arguments are stale_checkpoint", async () => {
    const first = makeEngine(root);
    const done = await first.engine.checkpoint({ checkpoint_id: "fin", episode_ids: R1, stop: false, controller_state: state });
    await journalEmptied(first.journal);
    const second = makeEngine(root, { epoch: 8 });
    const retried = await second.engine.checkpoint({ checkpoint_id: "fin", deadline_ts: second.clock.now() / 1000 - 60, episode_ids: R1, stop: false, controller_state: state });
    expect(retried).toEqual({ ...done, deleted: [], resume_failures: [], timings_ms: { prepare: 0, commit: 0, publish: 0, resume: 0 } });
    for (const other of [
      { episode_ids: [{ rollout_id: "r2", attempt: 0 }], stop: false, controller_state: state },
      { episode_ids: R1, stop: true, controller_state: state },
      { episode_ids: R1, stop: false, controller_state: { inline: { step: 13, optimizer: "adam" } } },
      { episode_ids: R1, stop: false, controller_state: null },
    ]) {
      expect((await refusalOf(second.engine.checkpoint({ checkpoint_id: "fin", ...other }))).code).toBe("stale_checkpoint");
    }
    expect(second.fake.calls).toEqual([]);
    expect(second.engine.openCheckpoint).toBeNull();
  });

  it("a successor answers publish of a state file by its name (and sha256 when named); another state is checkpoint_conflict", async () => {
    const first = makeEngine(root);
    await first.engine.prepare({ checkpoint_id: "fin-f" });
    await first.engine.commit({ checkpoint_id: "fin-f", episode_ids: null, stop: false });
    await writeFile(join(root, "fin-f", "trainer.pt"), "weights");
    const published = await first.engine.publish({ checkpoint_id: "fin-f", controller_state: { file: "trainer.pt" } });
    await first.engine.resume({ checkpoint_id: "fin-f" });
    await journalEmptied(first.journal);
    const manifest = await first.catalog.get("fin-f");
    const sha256 = manifest.controller_state && "sha256" in manifest.controller_state ? manifest.controller_state.sha256 : "";
    const second = makeEngine(root, { epoch: 8 });
    for (const named of [{ file: "trainer.pt" }, { file: "trainer.pt", sha256 }]) {
      expect(await second.engine.publish({ checkpoint_id: "fin-f", controller_state: named })).toEqual({ ...published, deleted: [] });
    }
    // docs/api.md publish: "already published with another controller state, open or not".
    for (const other of [{ file: "other.pt" }, { file: "trainer.pt", sha256: "0".repeat(64) }, { inline: { step: 1 } }, null]) {
      expect((await refusalOf(second.engine.publish({ checkpoint_id: "fin-f", controller_state: other }))).code).toBe("checkpoint_conflict");
    }
    expect(second.fake.calls).toEqual([]);
  });

  it("the coordinator that ran it answers too once 8 later checkpoints pushed its kept reply out", async () => {
    const { engine, fake } = makeEngine(root, { retention: 20 });
    const done = await engine.checkpoint({ checkpoint_id: "old", episode_ids: null, stop: false, controller_state: null });
    for (let i = 0; i < 8; i++) await engine.checkpoint({ checkpoint_id: `later-${i}`, episode_ids: null, stop: false, controller_state: null });
    const sent = fake.calls.length;
    expect(await engine.checkpoint({ checkpoint_id: "old", episode_ids: null, stop: false, controller_state: null })).toMatchObject({
      checkpoint_id: "old",
      epoch: done.epoch,
      manifest_path: done.manifest_path,
      published_at: done.published_at,
      participants: done.participants,
    });
    expect(fake.calls.length).toBe(sent);
  });

  it("publish of an id whose kept reply 8 later checkpoints pushed out: the same state is answered from checkpoint.json, another is checkpoint_conflict (not stale_checkpoint)", async () => {
    const { engine, fake, catalog } = makeEngine(root, { retention: 20 });
    const done = await engine.checkpoint({ checkpoint_id: "old-1", episode_ids: null, stop: false, controller_state: { inline: { step: 1 } } });
    for (let i = 0; i < 8; i++) await engine.checkpoint({ checkpoint_id: `later-${i}`, episode_ids: null, stop: false, controller_state: null });
    const sent = fake.calls.length;
    expect(await engine.publish({ checkpoint_id: "old-1", controller_state: { inline: { step: 1 } } })).toEqual({
      checkpoint_id: "old-1",
      manifest_path: done.manifest_path,
      published_at: done.published_at,
      deleted: [],
    });
    expect((await refusalOf(engine.publish({ checkpoint_id: "old-1", controller_state: { inline: { step: 2 } } }))).code).toBe("checkpoint_conflict");
    expect(fake.calls.length).toBe(sent);
    expect((await catalog.get("old-1")).controller_state).toEqual({ inline: { step: 1 } });
  });
});

/**
 * docs/api.md: "a refused request changes nothing". A restore's reply is lost; by the time the
 * controller retries it (same arguments, so its deadline_ts is past), the restored processes no longer
 * hold it (lease expired / restarted), so that restore is closed and the request is a fresh restore
 * after all: refused deadline_exceeded before anything is journaled or opened.
 */
describe("restore retried with a past deadline after its restore was released", () => {
  it("is refused without journaling or opening a new restore", async () => {
    const { engine, clock, fake, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "base", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.restore({ checkpoint_id: "base", deadline_ts, episode_ids: R1 });
    // the reply was lost; meanwhile every participant let the restore go (lease expired)
    for (const key of [...fake.state.keys()]) fake.state.set(key, { phase: "idle", checkpoint_id: null });
    clock.current += 70_000;
    const restoresBefore = fake.ops("restore").length;
    const retry = engine.restore({ checkpoint_id: "base", deadline_ts, episode_ids: R1 });
    await expect(retry).rejects.toMatchObject({ code: expect.stringMatching(/deadline_exceeded|restore_failed/) });
    // a refusal changes nothing: no restore left open, no `restoring` entry a successor would re-drive
    expect({ open: engine.openCheckpoint, journal: [...journal.entries.values()].map((e) => `${e.checkpoint_id}:${e.state}`) }).toEqual({ open: null, journal: [] });
    expect([...journal.entries.values()].map((e) => e.state)).not.toContain("restoring");
    expect(fake.ops("restore").length).toBe(restoresBefore);
    // and the next checkpoint is not blocked by a restore nobody drives
    await expect(engine.prepare({ checkpoint_id: "next", deadline_ts: clock.now() / 1000 + 60 })).resolves.toMatchObject({ prepared: true });
  });
});

/**
 * docs/api.md restore: a restore every participant refused with a code that promises nothing was
 * installed (a trainer restarted alone, restoring LATEST into Gym processes already resumed from it)
 * answers that refusal; "Retrying a controller op": a controller whose reply was lost retries with the
 * same id and arguments once its wait (deadline_ts + slack) is over, and gets the op's reply, and "A
 * retry answered from memory is not refused for a past deadline". Before the fix the retry answered
 * `deadline_exceeded` ("it never ran"), hiding the refusal the restore got: the same shape as the
 * journal_unavailable case (refuseUnjournaled).
 */
describe("a restore every participant refused, retried after its deadline", () => {
  it("gets the same refusal again, nothing sent, nothing opened or journaled", async () => {
    const { engine, clock, fake, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "done", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    for (const m of fake.members) fake.set(m.kind, m.instance, "restore", { error: "stale_checkpoint" });
    const deadline_ts = clock.now() / 1000 + 60;
    const first = await refusalOf(engine.restore({ deadline_ts, episode_ids: R1 }));
    expect(first.code).toBe("stale_checkpoint");
    clock.current += 70_000; // the reply was lost; the client retries the same request after its wait
    const sent = fake.calls.length;
    const again = await refusalOf(engine.restore({ deadline_ts, episode_ids: R1 }));
    expect([again.code, again.message]).toEqual([first.code, first.message]);
    expect(fake.calls.length).toBe(sent);
    expect({ open: engine.openCheckpoint, journal: journal.entries.size }).toEqual({ open: null, journal: 0 });
    // Another scope is another restore, not a retry: past its deadline it never runs.
    expect((await refusalOf(engine.restore({ deadline_ts, episode_ids: [{ rollout_id: "r2", attempt: 0 }] }))).code).toBe("deadline_exceeded");
    // Sent again with a deadline ahead, it runs again (the processes may have been replaced since).
    fake.script.clear();
    await expect(engine.restore({ checkpoint_id: "done", deadline_ts: clock.now() / 1000 + 60, episode_ids: R1 })).resolves.toMatchObject({ checkpoint_id: "done" });
  });
});

/**
 * docs/api.md resume: "Resuming an id that is already closed is idempotent, also when the retry's
 * deadline_ts has passed". The usual restart path: the controller stops with a `stop` checkpoint,
 * a new controller restores it (LATEST) into fresh Gym servers and resumes it; that resume's reply
 * is lost and the retry (same arguments, a past deadline_ts) must get the same success: once
 * restored (or released), a stop checkpoint's id is an ordinary closed one.
 */
describe("resume retried after the restore of a stop checkpoint was resumed", () => {
  it("answers success although its deadline_ts has passed", async () => {
    const { engine, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "stop-1", episode_ids: null, stop: true, controller_state: null });
    await journalEmptied(journal);
    // a new controller, fresh processes (status idle): restore LATEST, then resume it
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.restore({ checkpoint_id: "stop-1", deadline_ts, episode_ids: R1 });
    await engine.resume({ checkpoint_id: "stop-1", deadline_ts });
    // the resume's reply was lost; the client retries the same request after its reply timeout
    clock.current += 70_000;
    await expect(engine.resume({ checkpoint_id: "stop-1", deadline_ts })).resolves.toMatchObject({ checkpoint_id: "stop-1" });
  });

  it("the resume that released a stop checkpoint's parked participants, retried after its deadline, answers success", async () => {
    const { engine, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "stop-2", episode_ids: null, stop: true, controller_state: null });
    await journalEmptied(journal);
    const deadline_ts = clock.now() / 1000 + 60;
    const released = await engine.resume({ checkpoint_id: "stop-2", deadline_ts });
    expect(released.participants.length).toBe(5);
    clock.current += 70_000;
    await expect(engine.resume({ checkpoint_id: "stop-2", deadline_ts })).resolves.toMatchObject({ checkpoint_id: "stop-2" });
  });

  it("control: the same sequence with a non-stop checkpoint answers success", async () => {
    const { engine, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "go-1", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.restore({ checkpoint_id: "go-1", deadline_ts, episode_ids: R1 });
    await engine.resume({ checkpoint_id: "go-1", deadline_ts });
    clock.current += 70_000;
    await expect(engine.resume({ checkpoint_id: "go-1", deadline_ts })).resolves.toMatchObject({ checkpoint_id: "go-1" });
  });
});

/**
 * docs/api.md resume: "Resume of a `stop` checkpoint this coordinator published (its participants stay
 * parked for the controller to stop them) does the same [resumes those whose status shows them holding
 * it], for a controller that carries on after all". A controller that carried on prepared another
 * checkpoint first: the parked participants refused it (checkpoint_conflict), which stays open. Before
 * the fix the stop checkpoint's resume then answered success with no participants, leaving them parked
 * (and the new checkpoint unpreparable until their lease). Found by engine-model.test.ts (seed 282).
 */
describe("resume of a stop checkpoint while another checkpoint is open", () => {
  it("is refused checkpoint_conflict, nothing sent; once that one is resumed, it releases the parked participants", async () => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "stop-3", episode_ids: null, stop: true, controller_state: null });
    await journalEmptied(journal);
    expect(await engine.prepare({ checkpoint_id: "next-3" })).toMatchObject({ prepared: false });
    const sent = fake.calls.length;
    expect((await refusalOf(engine.resume({ checkpoint_id: "stop-3" }))).code).toBe("checkpoint_conflict");
    expect(fake.calls.length).toBe(sent);
    // Parked in stop-3, they refuse next-3's resume (checkpoint_conflict); it closes all the same.
    expect((await refusalOf(engine.resume({ checkpoint_id: "next-3" }))).code).toBe("checkpoint_conflict");
    const released = await engine.resume({ checkpoint_id: "stop-3" });
    expect(released.participants.length).toBe(5);
    expect([...fake.state].filter(([, held]) => held.checkpoint_id !== null)).toEqual([]);
  });
});

/**
 * docs/api.md resume: a restore's resume whose journal entry cannot be removed before leadership is
 * lost answers outcome_unknown: "retry it (a successor may still finish it as a restore whose
 * participant restarted, restore_failed)". Here the successor did exactly that (clean-up: attempt+1
 * retired everywhere, entry removed), then this coordinator became leader again. Answering the
 * controller's retry "resumed" from the previous term's memory would be wrong: the controller
 * continues rollouts whose attempt+1 was retired.
 */
describe("resume retried at a coordinator that lost and regained leadership meanwhile", () => {
  it("does not answer success from the previous term's memory", async () => {
    const { engine, journal, clock } = makeEngine(root, { requireRecovery: true });
    await engine.recover();
    await engine.checkpoint({ checkpoint_id: "rx", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    const deadline_ts = clock.now() / 1000 + 60;
    await engine.restore({ checkpoint_id: "rx", deadline_ts, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
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
    expect((await refusalOf(engine.resume({ checkpoint_id: "rx", deadline_ts }))).code).toBe("outcome_unknown");
    expect(journal.entries.get("rx")?.state).toBe("resuming");
    // A successor recovered the entry, found a restorer restarted, ran the restore's clean-up
    // (attempt+1 retired everywhere, restore_failed) and removed the entry. Then it died and this
    // coordinator is the leader again.
    failing = false;
    await remove("rx");
    await engine.recover();
    // the controller's retry (from the outcome_unknown) reaches this coordinator
    const retry = await engine.resume({ checkpoint_id: "rx", deadline_ts }).then(
      (reply) => ({ ok: true as const, reply }),
      (error: { code: string }) => ({ ok: false as const, code: error.code }),
    );
    expect(retry).not.toMatchObject({ ok: true });
  });
});

/**
 * A reused id whose directory holds the participants' files of an earlier attempt (clearLeftover
 * takes them away at prepare) while a participant the earlier abort never reached is still parked
 * `committed` in it: that participant would answer the new prepare and commit from its reply
 * cache, naming the very files taken away, and LATEST would name a manifest that is gone. The
 * prepare is refused instead (`checkpoint_conflict`, resume the id first), nothing moved or sent.
 */
describe("a reused id whose gym/ belongs to a participant still parked in it", () => {
  it("does not publish a checkpoint whose manifest was moved away", async () => {
    // e1 committed "step-1200" in the earlier attempt and is still parked in it
    const entry = await writeParticipant(root, "step-1200", "environment", "e1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
    const { engine, fake, writer } = makeEngine(root);
    fake.state.set("environment.e1", { phase: "committed", checkpoint_id: "step-1200" });
    const manifestText = readFileSync(join(root, "step-1200", entry.manifest_path), "utf8");
    const request = fake.request.bind(fake);
    fake.request = async (subject, body, options) => {
      // what ParticipantControlPlane answers from its reply cache for the id it is parked in
      if (subject.endsWith(".environment.e1.prepare")) {
        return JSON.stringify({ phase: "prepared", report: { ready: true, blockers: [], blocker_count: 0, counts: {}, restarts: [] } });
      }
      if (subject.endsWith(".environment.e1.commit")) {
        return JSON.stringify({
          phase: "committed",
          manifest: { ...JSON.parse(manifestText), schema_version: MANIFEST_SCHEMA_VERSION },
          manifest_path: entry.manifest_path,
          manifest_sha256: entry.manifest_sha256,
          episode_ids: entry.episode_ids,
          extras: {},
        });
      }
      return request(subject, body, options);
    };
    const sent = () => fake.calls.filter((c) => c.op !== "status").length;
    const before = sent();
    const outcome = await engine.checkpoint({ checkpoint_id: "step-1200", episode_ids: null, stop: false, controller_state: null }).then(
      () => "published",
      (error: { code: string }) => error.code,
    );
    await writer.settled();
    expect(outcome).toBe("checkpoint_conflict");
    expect(sent()).toBe(before);
    expect(existsSync(join(root, "step-1200", entry.manifest_path))).toBe(true);
  });
});

/**
 * A reused id's leftover is checked with a status probe (clearLeftover) after the checkpoint was
 * opened at this leader's epoch: leadership lost during that probe must end the prepare there, as
 * `not_leader` promises (nothing changed). Else the deposed coordinator moved the leftover away
 * (a successor may be committing that id into it) and kept the checkpoint open into its next
 * term, where it refused every new prepare `checkpoint_conflict` until someone resumed an id its
 * controller had been told was never opened.
 */
describe("leadership lost while a reused id's leftover is probed", () => {
  it("refuses the prepare not_leader with nothing changed: the leftover stays, nothing is opened, journaled or sent", async () => {
    await writeParticipant(root, "reused", "environment", "e1", ['{"episode_id":{"rollout_id":"r1","attempt":0}}']);
    const { engine, fake, journal, leadership } = makeEngine(root);
    const request = fake.request.bind(fake);
    fake.request = async (subject, body, options) => {
      if (subject.endsWith(".status")) {
        leadership.demote();
        engine.leadershipLost();
      }
      return request(subject, body, options);
    };
    expect((await refusalOf(engine.prepare({ checkpoint_id: "reused" }))).code).toBe("not_leader");
    expect(existsSync(join(root, "reused", "gym", "environment", "e1"))).toBe(true);
    expect(engine.openCheckpoint).toBeNull();
    expect(journal.log).toEqual([]);
    expect(fake.calls.filter((c) => c.op !== "status")).toEqual([]);
  });
});

/**
 * docs/api.md, prepare: `<root>/<id>` that is not a directory refuses the id `checkpoint_conflict`
 * ("use another checkpoint id"). A stray regular file there is not a published checkpoint: its
 * `<id>/checkpoint.json` answers ENOTDIR, which the catalog took for "published" (stale_checkpoint,
 * "is already published"), while verify and get call the same id not_found.
 */
describe("a fresh id naming a stray file under the root", () => {
  it("is refused checkpoint_conflict, not stale_checkpoint: nothing opened, journaled or sent", async () => {
    await writeFile(join(root, "stray"), "a controller's notes\n");
    const { engine, fake, journal } = makeEngine(root);
    const refused = await refusalOf(engine.prepare({ checkpoint_id: "stray" }));
    expect(refused).toMatchObject({ code: "checkpoint_conflict", message: expect.stringContaining("is not a directory") });
    expect(engine.openCheckpoint).toBeNull();
    expect(journal.log).toEqual([]);
    expect(fake.calls).toEqual([]);
    expect(readFileSync(join(root, "stray"), "utf8")).toBe("a controller's notes\n");
  });
});

/**
 * docs/api.md, prepare: a `<root>/<id>` that is a link is refused `checkpoint_conflict`. A link to
 * a directory holding a checkpoint.json is not a checkpoint this root holds either (`get`, `verify`
 * and `restore` refuse it, `ls` names it damaged): `has()` followed the link and called the id
 * published (stale_checkpoint, "is already published"), and recovery took it for a published one.
 */
describe("a fresh id whose directory is a symbolic link to a published checkpoint", () => {
  it("is not published (has() is false, scan still names it damaged); prepare is refused checkpoint_conflict with nothing opened, journaled or sent", async () => {
    const outside = await mkdtemp(join(tmpdir(), "gym-ckpt-engine-retries-outside-"));
    try {
      await mkdir(join(outside, "elsewhere"));
      await writeFile(join(outside, "elsewhere", "checkpoint.json"), "{}\n");
      await symlink(join(outside, "elsewhere"), join(root, "linked"));
      const { engine, fake, journal, catalog } = makeEngine(root);
      expect(catalog.has("linked")).toBe(false);
      expect(catalog.scan().damaged).toEqual([expect.objectContaining({ checkpoint_id: "linked", code: "invalid_checkpoint_state" })]);
      const refused = await refusalOf(engine.prepare({ checkpoint_id: "linked" }));
      expect(refused).toMatchObject({ code: "checkpoint_conflict", message: expect.stringContaining("is not a directory") });
      expect(engine.openCheckpoint).toBeNull();
      expect(journal.log).toEqual([]);
      expect(fake.calls).toEqual([]);
      expect(readFileSync(join(outside, "elsewhere", "checkpoint.json"), "utf8")).toBe("{}\n");
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });
});

/**
 * Resume continues past failures and answers one combined error (reference §2.1). On the wire a
 * refusal is only {code, detail}, cut at 4096 characters: the detail names every participant that
 * failed, with its code, before any per-participant text (docs/api.md, resume).
 */
describe("resume past failures", () => {
  it("the refusal the controller receives names every participant that failed to resume", async () => {
    const agents = Array.from({ length: 25 }, (_, i) => ({ kind: "agent" as Kind, instance: `agent${String(i).padStart(2, "0")}` }));
    const { engine, fake } = makeEngine(root, { members: [{ kind: "environment", instance: "e1" }, ...agents] });
    await engine.prepare({ checkpoint_id: "many" });
    for (const a of agents) fake.set("agent", a.instance, "resume", "unreachable");
    const error = await refusalOf(engine.resume({ checkpoint_id: "many" }));
    expect(error.code).toBe("unreachable");
    const wire = error.toReply().error.detail;
    const missing = agents.filter((a) => !wire.includes(`agent/${a.instance}:`)).map((a) => a.instance);
    expect(missing).toEqual([]);
  });
});
