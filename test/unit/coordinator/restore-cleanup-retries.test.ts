import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { NoRespondersFailure } from "../../../coordinator/engine/transport.js";
import { refusalOf } from "../../support/refusal.js";
import { FOUR_KINDS, journalEmptied, makeEngine, writers } from "./fake-participants.js";

/**
 * docs/protocol.md, restore: a failed restore's clean-up retires attempt+1, then resumes everyone,
 * within max(deadline, now + 30 s). These pin what it does within that window.
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-cleanup-retries-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const SCOPE = [{ rollout_id: "r1", attempt: 0 }];

/**
 * Before, a clean-up resume that failed `unreachable` (a participant briefly off NATS) was sent
 * once, while a failed retire is sent again until the clean-up's deadline: collect sends no resume
 * after `restore_failed`, so that participant stayed parked in the restore until its lease expired
 * (600 s by default), refusing every prepare and retire.
 */
describe("a failed restore's clean-up resume that does not get through at first", () => {
  it("is sent again until it does, before restore_failed is answered", async () => {
    const { engine, fake, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "c1", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    fake.set("environment", "e1", "restore", { error: "storage_error" });
    // m1 is off NATS for its first resume (no responders), back for the next.
    let dropped = 0;
    const request = fake.request.bind(fake);
    fake.request = async (subject, body, options) => {
      if (subject.endsWith(".model.m1.resume") && dropped++ === 0) throw new NoRespondersFailure(subject);
      return request(subject, body, options);
    };
    const started = clock.now();
    const deadline_ts = started / 1000 + 10;
    expect((await refusalOf(engine.restore({ checkpoint_id: "c1", deadline_ts, episode_ids: SCOPE }))).code).toBe("restore_failed");
    expect(dropped).toBe(2);
    expect(fake.state.get("model.m1")?.checkpoint_id ?? null).toBeNull();
    expect(clock.now()).toBeLessThan(started + 30_000); // max(deadline, now + 30 s)
    // Released by the clean-up: the controller's resume sends nothing more, and answers the failure.
    const sent = fake.ops("resume").length;
    expect((await refusalOf(engine.resume({ checkpoint_id: "c1", deadline_ts: clock.now() / 1000 + 10 }))).code).toBe("restore_failed");
    expect(fake.ops("resume").length).toBe(sent);
  });

  it("gone for good: sent again until the clean-up's deadline only, and left for the controller's resume", async () => {
    const { engine, fake, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "c2", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    fake.set("environment", "e1", "restore", { error: "storage_error" });
    fake.set("model", "m1", "resume", "unreachable");
    const started = clock.now();
    const deadline_ts = started / 1000 + 10;
    expect((await refusalOf(engine.restore({ checkpoint_id: "c2", deadline_ts, episode_ids: SCOPE }))).code).toBe("restore_failed");
    const tries = fake.ops("resume").filter((c) => c.kind === "model" && c.body.checkpoint_id === "c2" && c.answered === "unreachable");
    expect(tries.length).toBeGreaterThan(1);
    expect(clock.now()).toBeLessThanOrEqual(started + 30_000);
    // Back: the controller's resume releases it, as after any failed resume.
    fake.set("model", "m1", "resume", "ok");
    const sent = fake.ops("resume").length;
    expect((await refusalOf(engine.resume({ checkpoint_id: "c2", deadline_ts: clock.now() / 1000 + 10 }))).code).toBe("restore_failed");
    expect(fake.ops("resume").slice(sent).map((c) => `${c.kind}/${c.instance}`)).toEqual(["model/m1"]);
    expect(fake.state.get("model.m1")?.checkpoint_id ?? null).toBeNull();
  });
});

/**
 * Before, the clean-up's retire stages all had the clean-up's deadline: a stalled environment
 * participant's retire used the whole window, so the agent, model and resources retires arrived
 * after it and were refused `deadline_exceeded`, attempt+1 left installed at healthy participants.
 */
describe("a failed restore's clean-up whose environment retire stalls", () => {
  it("still sends every later retire stage in time, callers before callees", async () => {
    const { engine, fake, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "c3", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    // Fresh processes (a real participant refuses a restore of a checkpoint it resumed), deadlines checked as a real one does.
    fake.memory = true;
    for (const m of FOUR_KINDS) fake.restart(m.kind, m.instance);
    fake.set("model", "m1", "restore", { error: "storage_error" });
    fake.set("environment", "e1", "retire", "timeout");
    const started = clock.now();
    const deadline_ts = started / 1000 + 10;
    const failed = await refusalOf(engine.restore({ checkpoint_id: "c3", deadline_ts, episode_ids: SCOPE }));
    expect(failed.code).toBe("restore_failed");
    const retires = fake.ops("retire");
    const answered = (kind: string) => retires.filter((c) => c.kind === kind).map((c) => c.answered);
    expect(answered("agent")).toEqual(["ok", "ok"]);
    expect(answered("model")).toEqual(["ok"]);
    expect(answered("resources")).toEqual(["ok"]);
    // The environment's retire failed, so the reply names it first; the healthy ones it does not.
    expect(failed.message).toMatch(/^attempt\+1 could not be retired at environment\/e1/);
    expect(failed.message).not.toMatch(/retired at [^;]*agent\//);
    // Callers before callees: each stage sent once the one before it answered.
    const firstOf = (kind: string) => retires.find((c) => c.kind === kind)!;
    expect(firstOf("agent").seq).toBeGreaterThan(firstOf("environment").answeredSeq!);
    expect(firstOf("resources").seq).toBeGreaterThan(Math.max(...retires.filter((c) => c.kind === "agent").map((c) => c.answeredSeq!)));
    // Everyone resumed, within the clean-up's window (plus one request's slack).
    for (const m of FOUR_KINDS) expect(fake.state.get(`${m.kind}.${m.instance}`)?.checkpoint_id ?? null).toBeNull();
    expect(clock.now()).toBeLessThanOrEqual(started + 30_000 + 5000);
  });
});

const M1 = { kind: "model" as const, instance: "m1" };

/** The tries of `op` at model/m1 for restore `id` (not the resume of the checkpoint op that made it). */
function triesAtM1(fake: ReturnType<typeof makeEngine>["fake"], op: "retire" | "resume", id: string) {
  const restored = fake.ops("restore").find((c) => c.body.checkpoint_id === id)!.seq;
  return fake.ops(op).filter((c) => c.kind === "model" && c.body.checkpoint_id === id && c.seq > restored);
}

/**
 * Before, a participant down for good was sent its clean-up resume again until the clean-up's
 * deadline, max(deadline, now + 30 s), and the controller waited that long for `restore_failed`,
 * though the membership registry no longer listed it (its heartbeat lapsed): no resend could reach it.
 */
describe("a failed restore's clean-up at a participant the membership registry no longer lists", () => {
  it("gives up its resume at once, answers restore_failed without waiting out the window, and names it", async () => {
    const { engine, fake, clock, journal, membership } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "c4", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    fake.set("environment", "e1", "restore", { error: "storage_error" });
    fake.set("model", "m1", "resume", "unreachable");
    // Down for good by the clean-up's resume: its entry lapsed.
    const request = fake.request.bind(fake);
    fake.request = async (subject, body, options) => {
      if (subject.endsWith(".model.m1.resume")) membership.leave(M1);
      return request(subject, body, options);
    };
    const started = clock.now();
    const failed = await refusalOf(engine.restore({ checkpoint_id: "c4", deadline_ts: started / 1000 + 10, episode_ids: SCOPE }));
    expect(failed.code).toBe("restore_failed");
    expect(triesAtM1(fake, "resume", "c4").length).toBe(1);
    expect(clock.now()).toBeLessThan(started + 1000); // no resend, no pause
    expect(failed.message).toMatch(/resume did not get through at model\/m1 \(unreachable[^)]*\) \(not in the membership registry/);
    // Back after all (off NATS longer than its heartbeat's TTL): the controller's resume still releases it.
    fake.set("model", "m1", "resume", "ok");
    const sent = fake.ops("resume").length;
    expect((await refusalOf(engine.resume({ checkpoint_id: "c4", deadline_ts: clock.now() / 1000 + 10 }))).code).toBe("restore_failed");
    expect(fake.ops("resume").slice(sent).map((c) => `${c.kind}/${c.instance}`)).toEqual(["model/m1"]);
  });

  it("resends while it is listed, and stops once its entry lapses", async () => {
    const { engine, fake, clock, journal, membership } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "c5", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    fake.set("environment", "e1", "restore", { error: "storage_error" });
    fake.set("model", "m1", "resume", "unreachable");
    let tries = 0;
    const request = fake.request.bind(fake);
    fake.request = async (subject, body, options) => {
      if (subject.endsWith(".model.m1.resume") && ++tries === 3) membership.leave(M1);
      return request(subject, body, options);
    };
    const started = clock.now();
    expect((await refusalOf(engine.restore({ checkpoint_id: "c5", deadline_ts: started / 1000 + 10, episode_ids: SCOPE }))).code).toBe("restore_failed");
    expect(triesAtM1(fake, "resume", "c5").length).toBe(3);
    expect(clock.now()).toBeLessThan(started + 5000); // 100 + 200 ms of pauses, not the 30 s window
  });

  // Cut off itself, the coordinator's view ages every member out: before, that emptied view gave
  // up every participant at once, named "not in the membership registry any more", though nothing
  // was known of them, and attempt+1 stayed held where a resend after the reconnect would retire it.
  it("is not given up while this coordinator's own view is stale (its connection lost): sent again until the deadline", async () => {
    const { engine, fake, clock, journal, membership } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "c7", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    fake.set("environment", "e1", "restore", { error: "storage_error" });
    fake.set("model", "m1", "retire", "unreachable");
    const request = fake.request.bind(fake);
    fake.request = async (subject, body, options) => {
      if (subject.endsWith(".model.m1.retire")) {
        // This coordinator's connection lost long enough for every entry to age out of its view.
        membership.current = false;
        for (const m of FOUR_KINDS) membership.leave(m);
      }
      return request(subject, body, options);
    };
    const failed = await refusalOf(engine.restore({ checkpoint_id: "c7", deadline_ts: clock.now() / 1000 + 10, episode_ids: SCOPE }));
    expect(failed.code).toBe("restore_failed");
    expect(triesAtM1(fake, "retire", "c7").length).toBeGreaterThan(1);
    expect(failed.message).toMatch(/^attempt\+1 could not be retired at model\/m1 \(unreachable: /);
    expect(failed.message).not.toMatch(/not in the membership registry/);
  });

  it("gives up its retire too, and names it as not retired", async () => {
    const { engine, fake, clock, journal, membership } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "c6", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    fake.set("environment", "e1", "restore", { error: "storage_error" });
    fake.set("model", "m1", "retire", "unreachable");
    fake.set("model", "m1", "resume", "unreachable");
    let tries = 0;
    const request = fake.request.bind(fake);
    fake.request = async (subject, body, options) => {
      if (subject.endsWith(".model.m1.retire") && ++tries === 2) membership.leave(M1);
      return request(subject, body, options);
    };
    const started = clock.now();
    const failed = await refusalOf(engine.restore({ checkpoint_id: "c6", deadline_ts: started / 1000 + 10, episode_ids: SCOPE }));
    expect(failed.code).toBe("restore_failed");
    expect(triesAtM1(fake, "retire", "c6").length).toBe(2);
    expect(triesAtM1(fake, "resume", "c6").length).toBe(1); // not listed any more when the resume ran
    expect(clock.now()).toBeLessThan(started + 5000);
    expect(failed.message).toMatch(/^attempt\+1 could not be retired at model\/m1 \(unreachable: [^)]*\) \(not in the membership registry/);
    expect(failed.data?.unretired).toEqual([expect.objectContaining({ kind: "model", instance: "m1", code: "unreachable" })]);
  });
});

/**
 * Before, a clean-up retire that failed `unreachable` (no responders: never acknowledged) was
 * neither sent again nor named in `restore_failed`, as if the process that restored were gone; a
 * participant off NATS for a moment still holds attempt+1, and the controller could not tell.
 */
describe("a failed restore's clean-up retire that fails unreachable at a listed participant", () => {
  it("is sent again until the clean-up's deadline, and restore_failed names it first", async () => {
    const { engine, fake, clock, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "c7", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    fake.set("environment", "e1", "restore", { error: "storage_error" });
    fake.set("model", "m1", "retire", "unreachable");
    const started = clock.now();
    const failed = await refusalOf(engine.restore({ checkpoint_id: "c7", deadline_ts: started / 1000 + 10, episode_ids: SCOPE }));
    expect(failed.code).toBe("restore_failed");
    expect(triesAtM1(fake, "retire", "c7").length).toBeGreaterThan(1);
    expect(failed.message).toMatch(/^attempt\+1 could not be retired at model\/m1 \(unreachable: /);
    expect(failed.data?.unretired).toEqual([expect.objectContaining({ kind: "model", instance: "m1", code: "unreachable" })]);
    // Everyone resumed, m1 included (it answers its resume).
    expect(fake.state.get("model.m1")?.checkpoint_id ?? null).toBeNull();
    expect(clock.now()).toBeLessThanOrEqual(started + 30_000 + 5000);
  });

  it("back on NATS before the deadline: retired then, and not named", async () => {
    const { engine, fake, journal, clock } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "c8", episode_ids: null, stop: false, controller_state: null });
    await journalEmptied(journal);
    fake.set("environment", "e1", "restore", { error: "storage_error" });
    let dropped = 0;
    const request = fake.request.bind(fake);
    fake.request = async (subject, body, options) => {
      if (subject.endsWith(".model.m1.retire") && dropped++ === 0) throw new NoRespondersFailure(subject);
      return request(subject, body, options);
    };
    const failed = await refusalOf(engine.restore({ checkpoint_id: "c8", deadline_ts: clock.now() / 1000 + 10, episode_ids: SCOPE }));
    expect(failed.code).toBe("restore_failed");
    expect(dropped).toBe(2);
    expect(failed.message).not.toMatch(/could not be retired/);
  });
});
