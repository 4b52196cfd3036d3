import { readFileSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { refusalOf } from "../../support/refusal.js";
import { TestClock, journalEmptied, makeEngine, writers } from "./fake-participants.js";

/**
 * Controller ops that reach the coordinator at the same time (two controllers, or one retrying
 * after a lost reply while the first request still runs). The engine runs one op at a time, in
 * arrival order; each op is answered as the state the ops before it left (docs/api.md).
 * Participant replies are held and released by the test (FakeParticipants.hold): no sleeps.
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-concurrent-ops-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const R1 = [{ rollout_id: "r1", attempt: 0 }];
const latest = () => readFileSync(join(root, "LATEST"), "utf8").trim();

/** A beforePublication hook that holds the publication of `id` (any, when undefined) until `release`, counting them. */
function heldPublication(id?: string) {
  let release!: () => void;
  const gate = new Promise<void>((resolve) => (release = resolve));
  let reach!: () => void;
  const reached = new Promise<void>((resolve) => (reach = resolve));
  const held = {
    count: 0,
    reached,
    release: () => release(),
    hooks: {
      beforePublication: async (publishing: string) => {
        if (id !== undefined && publishing !== id) return;
        held.count++;
        reach();
        await gate;
      },
    },
  };
  return held;
}

describe("an op retried while the first is still running", () => {
  it("commit: the retry waits for the first and gets its reply; each participant is sent one commit", async () => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "c1" });
    const held = fake.hold("resources", "r1", "commit");
    const first = engine.commit({ checkpoint_id: "c1", episode_ids: R1, stop: false });
    await held.reached;
    const retry = engine.commit({ checkpoint_id: "c1", episode_ids: R1, stop: false });
    held.release();
    const [a, b] = await Promise.all([first, retry]);
    expect(b).toEqual(a);
    expect(fake.ops("commit")).toHaveLength(fake.members.length);
    expect(journal.log.filter((e) => e.checkpoint_id === "c1" && e.state === "decided")).toHaveLength(1);
  });

  it("publish: one publication, LATEST moved once; the retry gets the same reply", async () => {
    const held = heldPublication();
    const { engine } = makeEngine(root, { hooks: held.hooks });
    await engine.prepare({ checkpoint_id: "p1" });
    await engine.commit({ checkpoint_id: "p1", episode_ids: R1, stop: false });
    const first = engine.publish({ checkpoint_id: "p1", controller_state: null });
    await held.reached;
    const retry = engine.publish({ checkpoint_id: "p1", controller_state: null });
    held.release();
    const [a, b] = await Promise.all([first, retry]);
    expect(b).toEqual(a);
    expect(held.count).toBe(1);
    expect(latest()).toBe("p1");
  });

  it("checkpoint: the retry gets the first's reply; nothing is sent twice", async () => {
    const { engine, fake } = makeEngine(root);
    const held = fake.hold("resources", "r1", "prepare");
    const request = { checkpoint_id: "k1", episode_ids: R1, stop: false, controller_state: null };
    const first = engine.checkpoint(request);
    await held.reached;
    const retry = engine.checkpoint(request);
    held.release();
    const [a, b] = await Promise.all([first, retry]);
    expect(b).toEqual(a);
    for (const op of ["prepare", "commit", "resume"] as const) expect(fake.ops(op)).toHaveLength(fake.members.length);
  });

  it("resume: the retry of a resume still running answers once it closed, nothing sent twice", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "r1" });
    const held = fake.hold("environment", "e1", "resume");
    const first = engine.resume({ checkpoint_id: "r1" });
    await held.reached;
    const retry = engine.resume({ checkpoint_id: "r1" });
    held.release();
    await first;
    await expect(retry).resolves.toEqual({ checkpoint_id: "r1", participants: [] });
    expect(fake.ops("resume")).toHaveLength(fake.members.length);
  });
});

describe("two controllers' ops on different checkpoints", () => {
  it("prepare of another id while one prepares: checkpoint_conflict once the first is prepared, nothing sent for it", async () => {
    const { engine, fake, journal } = makeEngine(root);
    const held = fake.hold("resources", "r1", "prepare");
    const a = engine.prepare({ checkpoint_id: "a" });
    await held.reached;
    const b = refusalOf(engine.prepare({ checkpoint_id: "b" }));
    held.release();
    expect((await a).prepared).toBe(true);
    expect((await b).code).toBe("checkpoint_conflict");
    expect(fake.calls.filter((c) => c.body.checkpoint_id === "b")).toHaveLength(0);
    expect(journal.entries.has("b")).toBe(false);
  });

  it("a restore sent while a checkpoint runs restores what LATEST names once that checkpoint closed", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "k0", episode_ids: R1, stop: false, controller_state: null });
    const held = fake.hold("resources", "r1", "prepare");
    const checkpoint = engine.checkpoint({ checkpoint_id: "k1", episode_ids: R1, stop: false, controller_state: null });
    await held.reached;
    const restore = engine.restore({ episode_ids: R1 });
    held.release();
    await checkpoint;
    await expect(restore).resolves.toMatchObject({ checkpoint_id: "k1" });
    // No restore left before the checkpoint's last resume.
    const firstRestore = fake.calls.find((c) => c.op === "restore")!.seq;
    expect(Math.max(...fake.calls.filter((c) => c.op === "resume" && c.body.checkpoint_id === "k1").map((c) => c.seq))).toBeLessThan(firstRestore);
  });

  it("a checkpoint sent while a restore runs: checkpoint_conflict once it is restored, nothing sent for it; the restore stays open", async () => {
    const { engine, fake, journal } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "k0", episode_ids: R1, stop: false, controller_state: null });
    const held = fake.hold("resources", "r1", "restore");
    const restore = engine.restore({ episode_ids: R1 });
    await held.reached;
    const checkpoint = refusalOf(engine.checkpoint({ checkpoint_id: "k1", episode_ids: R1, stop: false, controller_state: null }));
    held.release();
    await restore;
    expect((await checkpoint).code).toBe("checkpoint_conflict");
    expect(fake.calls.filter((c) => c.body.checkpoint_id === "k1" && c.op !== "status")).toHaveLength(0);
    expect(journal.entries.has("k1")).toBe(false);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "k0", phase: "restored" });
  });

  it("retire sent while a checkpoint is prepared: invalid_phase, nothing sent, the checkpoint still commits", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.prepare({ checkpoint_id: "c2" });
    const sent = fake.calls.length;
    expect((await refusalOf(engine.retire({ episode_ids: R1 }))).code).toBe("invalid_phase");
    expect((await refusalOf(engine.forget({ rollout_ids: ["r1"] }))).code).toBe("invalid_phase");
    expect(fake.calls.length).toBe(sent);
    await engine.commit({ checkpoint_id: "c2", episode_ids: R1, stop: false });
  });

  it("retire sent while a restore runs goes out once it is restored, in the restored checkpoint", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "k0", episode_ids: R1, stop: false, controller_state: null });
    const held = fake.hold("resources", "r1", "restore");
    const restore = engine.restore({ episode_ids: R1 });
    await held.reached;
    const retire = engine.retire({ episode_ids: [{ rollout_id: "r1", attempt: 1 }] });
    held.release();
    await restore;
    await retire;
    const retires = fake.ops("retire");
    expect(retires.length).toBeGreaterThan(0);
    expect(retires.every((c) => c.body.checkpoint_id === "k0")).toBe(true);
    expect(Math.min(...retires.map((c) => c.seq))).toBeGreaterThan(Math.max(...fake.ops("restore").map((c) => c.seq)));
  });
});

describe("publish racing resume of a committed checkpoint", () => {
  it("resume first: the checkpoint is abandoned, the publish after it is stale_checkpoint and LATEST stays", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "k0", episode_ids: R1, stop: false, controller_state: null });
    await engine.prepare({ checkpoint_id: "c3" });
    await engine.commit({ checkpoint_id: "c3", episode_ids: R1, stop: false });
    const held = fake.hold("environment", "e1", "resume");
    const resume = engine.resume({ checkpoint_id: "c3" });
    await held.reached;
    const publish = refusalOf(engine.publish({ checkpoint_id: "c3", controller_state: null }));
    held.release();
    await resume;
    expect((await publish).code).toBe("stale_checkpoint");
    expect(latest()).toBe("k0");
  });

  it("publish first: published and LATEST, then the resume closes it", async () => {
    const held = heldPublication();
    const { engine, journal } = makeEngine(root, { hooks: held.hooks });
    await engine.prepare({ checkpoint_id: "c4" });
    await engine.commit({ checkpoint_id: "c4", episode_ids: R1, stop: false });
    const publish = engine.publish({ checkpoint_id: "c4", controller_state: null });
    await held.reached;
    const resume = engine.resume({ checkpoint_id: "c4" });
    held.release();
    await publish;
    await resume;
    expect(latest()).toBe("c4");
    expect(engine.openCheckpoint).toBeNull();
    await journalEmptied(journal);
  });
});

describe("list and get while a publication runs (they take no lock)", () => {
  it("list names LATEST among the checkpoints it lists, though a publication and its retention ran while it read", async () => {
    const { engine, catalog } = makeEngine(root, { retention: 2 });
    for (const id of ["k1", "k2"]) await engine.checkpoint({ checkpoint_id: id, episode_ids: R1, stop: false, controller_state: null });
    // LATEST's read is slow (its open queued in the thread pool behind the publication's fsyncs):
    // k3 is published, LATEST renamed to it and k1 deleted by retention before the read happens.
    const read = catalog.latest.bind(catalog);
    let releaseRead!: () => void;
    const readGate = new Promise<void>((resolve) => (releaseRead = resolve));
    let gated = true;
    catalog.latest = async () => {
      if (gated) {
        gated = false;
        await readGate;
      }
      return read();
    };
    const listing = engine.list();
    const published = await engine.checkpoint({ checkpoint_id: "k3", episode_ids: R1, stop: false, controller_state: null });
    expect(published.deleted).toEqual(["k1"]);
    releaseRead();
    const { latest: named, checkpoints } = await listing;
    expect(named).toBe("k3");
    expect(checkpoints.map((c) => c.checkpoint_id)).toContain(named);
    expect(checkpoints.map((c) => c.checkpoint_id)).not.toContain("k1");
  });
});

/** A TestClock whose timers fire when the test moves time on (`advance`). */
class TimerClock extends TestClock {
  private timers: { at: number; fn: () => void }[] = [];
  override setTimer(fn: () => void, ms: number): () => void {
    const timer = { at: this.current + ms, fn };
    this.timers.push(timer);
    return () => {
      this.timers = this.timers.filter((t) => t !== timer);
    };
  }
  advance(ms: number): void {
    this.current += ms;
    const due = this.timers.filter((t) => t.at <= this.current);
    this.timers = this.timers.filter((t) => t.at > this.current);
    for (const t of due) t.fn();
  }
}

/** Lets every pending promise callback run (no timer, no I/O involved). */
const settle = () => new Promise<void>((resolve) => setImmediate(resolve));

describe("an op whose deadline passes while it waits for another op", () => {
  it("answers deadline_exceeded at its deadline plus request_slack_ms, while the other still runs, and never runs", async () => {
    const clock = new TimerClock();
    const { engine, fake } = makeEngine(root, { clock, slackMs: 2000 });
    const held = fake.hold("resources", "r1", "prepare");
    const checkpoint = engine.checkpoint({ checkpoint_id: "k1", episode_ids: R1, stop: false, controller_state: null, deadline_ts: clock.now() / 1000 + 60 });
    await held.reached;
    let answer: { code: string } | undefined;
    const retire = refusalOf(engine.retire({ episode_ids: R1, deadline_ts: clock.now() / 1000 + 5 })).then((r) => (answer = r));
    clock.advance(5000 + 1999);
    await settle();
    expect(answer).toBeUndefined(); // still in time: it waits its turn
    clock.advance(1);
    await settle();
    expect(answer?.code).toBe("deadline_exceeded");
    held.release();
    await checkpoint;
    await retire;
    expect(fake.ops("retire")).toHaveLength(0);
  });

  it("a retry sent past its deadline (its reply was lost) still waits request_slack_ms for the op ahead of it, and gets its reply", async () => {
    const clock = new TimerClock();
    const { engine, fake } = makeEngine(root, { clock, slackMs: 2000 });
    await engine.prepare({ checkpoint_id: "c1" });
    const deadline_ts = clock.now() / 1000 + 5;
    const held = fake.hold("resources", "r1", "commit");
    const first = engine.commit({ checkpoint_id: "c1", episode_ids: R1, stop: false, deadline_ts });
    await held.reached;
    clock.advance(6000); // the participant is late; the controller's client retried meanwhile
    const retry = engine.commit({ checkpoint_id: "c1", episode_ids: R1, stop: false, deadline_ts });
    clock.advance(1000);
    held.release();
    const [a, b] = await Promise.all([first, retry]);
    expect(b).toEqual(a);
  });

  it("a retry of the op still running past its deadline plus request_slack_ms (a checkpoint's held resume) waits for it and gets its reply, not deadline_exceeded", async () => {
    const clock = new TimerClock();
    const { engine, fake } = makeEngine(root, { clock, slackMs: 2000 });
    const request = { checkpoint_id: "k1", episode_ids: R1, stop: false, controller_state: null, deadline_ts: clock.now() / 1000 + 60 };
    const held = fake.hold("resources", "r1", "resume");
    const first = engine.checkpoint(request);
    await held.reached;
    let answer: unknown;
    const retry = engine.checkpoint(request).then(
      (reply) => (answer = reply),
      (error: unknown) => (answer = error),
    );
    clock.advance(62_001);
    await settle();
    expect(answer).toBeUndefined(); // still waiting for the op it repeats
    held.release();
    const reply = await first;
    await retry;
    expect(answer).toEqual(reply);
    expect(fake.ops("commit").length).toBe(fake.ops("prepare").length); // nothing sent twice
  });

  it("a retry that waited past its bound for the op it repeats answers deadline_exceeded once that op ended and another op ahead of it runs, not after that one too", async () => {
    const clock = new TimerClock();
    const { engine, fake } = makeEngine(root, { clock, slackMs: 2000 });
    const request = { checkpoint_id: "k1", episode_ids: R1, stop: false, controller_state: null, deadline_ts: clock.now() / 1000 + 60 };
    const heldResume = fake.hold("resources", "r1", "resume");
    const first = engine.checkpoint(request);
    await heldResume.reached;
    // Another controller's checkpoint, queued before the retry, with a long deadline.
    const other = engine.checkpoint({ ...request, checkpoint_id: "k2", deadline_ts: clock.now() / 1000 + 300 });
    let answer: { code: string } | undefined;
    const retry = refusalOf(engine.checkpoint(request)).then((r) => (answer = r));
    clock.advance(62_001); // the retry's bound passed while k1 runs: it waits for k1
    await settle();
    expect(answer).toBeUndefined();
    const heldPrepare = fake.hold("resources", "r1", "prepare");
    heldResume.release();
    await first;
    await heldPrepare.reached; // k2 runs now, for up to its own deadline
    await settle();
    expect(answer?.code).toBe("deadline_exceeded");
    heldPrepare.release();
    await other;
    await retry;
  });

  it("a retry of a restore of LATEST (no checkpoint_id) still running past its bound waits for it and gets its reply, not deadline_exceeded", async () => {
    const clock = new TimerClock();
    const { engine, fake } = makeEngine(root, { clock, slackMs: 2000 });
    await engine.checkpoint({ checkpoint_id: "k0", episode_ids: R1, stop: false, controller_state: null });
    const request = { episode_ids: R1, deadline_ts: clock.now() / 1000 + 5 };
    const held = fake.hold("resources", "r1", "restore");
    const first = engine.restore(request);
    await held.reached;
    clock.advance(6000); // the participant is late; the controller's client retried meanwhile
    let answer: unknown;
    const retry = engine.restore(request).then(
      (reply) => (answer = reply),
      (error: unknown) => (answer = error),
    );
    clock.advance(2001); // the retry's bound (now + request_slack_ms) passed while the restore runs
    await settle();
    expect(answer).toBeUndefined(); // still waiting for the restore it repeats
    held.release();
    const reply = await first;
    await retry;
    expect(answer).toEqual(reply);
    expect(fake.ops("restore")).toHaveLength(fake.members.length); // nothing sent twice
  });

  it("a checkpoint without checkpoint_id behind one still running is no retry of it (its id is generated): deadline_exceeded at its bound", async () => {
    const clock = new TimerClock();
    const { engine, fake } = makeEngine(root, { clock, slackMs: 2000 });
    const request = { episode_ids: R1, stop: false, controller_state: null, deadline_ts: clock.now() / 1000 + 60 };
    const held = fake.hold("resources", "r1", "resume");
    const first = engine.checkpoint(request);
    await held.reached;
    let answer: { code: string } | undefined;
    const second = refusalOf(engine.checkpoint(request)).then((r) => (answer = r));
    clock.advance(62_000);
    await settle();
    expect(answer?.code).toBe("deadline_exceeded");
    held.release();
    await first;
    await second;
    expect(fake.ops("prepare")).toHaveLength(fake.members.length); // the second never ran
  });

  it("an op without deadline_ts gives up at the default timeout plus request_slack_ms", async () => {
    const clock = new TimerClock();
    const { engine, fake } = makeEngine(root, { clock, slackMs: 2000 });
    const held = fake.hold("resources", "r1", "prepare");
    const first = engine.prepare({ checkpoint_id: "a", deadline_ts: clock.now() / 1000 + 60 });
    await held.reached;
    let answer: { code: string } | undefined;
    const other = refusalOf(engine.prepare({ checkpoint_id: "b" })).then((r) => (answer = r));
    clock.advance(10_000 + 2000); // makeEngine's default_timeout_ms is 10 s
    await settle();
    expect(answer?.code).toBe("deadline_exceeded");
    held.release();
    await first;
    await other;
    expect(fake.calls.filter((c) => c.body.checkpoint_id === "b")).toHaveLength(0);
  });
});

describe("an op that arrives while the new leader recovers its predecessor's checkpoints", () => {
  it("waits for the recovery and is then served, as the state recovery left", async () => {
    const { engine, fake } = makeEngine(root, { requireRecovery: true });
    const held = fake.hold("resources", "r1", "status"); // recovery's status probe
    const recovery = engine.recover();
    await held.reached;
    const prepare = engine.prepare({ checkpoint_id: "after-recovery" });
    held.release();
    await recovery;
    expect((await prepare).prepared).toBe(true);
    const firstPrepare = Math.min(...fake.ops("prepare").map((c) => c.seq));
    expect(Math.max(...fake.ops("status").map((c) => c.seq))).toBeLessThan(firstPrepare);
  });

  it("a recovery that fails (the journal unreadable) leaves the op it held refused not_leader, nothing sent", async () => {
    const { engine, fake, journal } = makeEngine(root, { requireRecovery: true });
    let fail!: (error: Error) => void;
    let reached!: () => void;
    const listing = new Promise<void>((resolve) => (reached = resolve));
    journal.list = () =>
      new Promise((_resolve, reject) => {
        fail = reject;
        reached();
      });
    const recovery = engine.recover().catch((error: unknown) => error);
    await listing;
    const prepare = refusalOf(engine.prepare({ checkpoint_id: "during-recovery" }));
    fail(new Error("KV unavailable"));
    await recovery;
    expect((await prepare).code).toBe("not_leader");
    expect(fake.ops("prepare")).toHaveLength(0);
  });
});

describe("reads and a second restore while a publication or a restore runs", () => {
  it("status, get and list during a publication: the checkpoint is committed, not yet listed or gettable, LATEST unmoved", async () => {
    const held = heldPublication("k2");
    const { engine } = makeEngine(root, { hooks: held.hooks });
    await engine.checkpoint({ checkpoint_id: "k1", episode_ids: R1, stop: false, controller_state: null });
    const checkpoint = engine.checkpoint({ checkpoint_id: "k2", episode_ids: R1, stop: false, controller_state: null });
    await held.reached;
    expect((await engine.status()).checkpoint).toMatchObject({ checkpoint_id: "k2", phase: "committed" });
    expect((await refusalOf(engine.get({ checkpoint_id: "k2" }))).code).toBe("not_found");
    const listed = await engine.list();
    expect(listed.latest).toBe("k1");
    expect(listed.checkpoints.map((c) => c.checkpoint_id)).toEqual(["k1"]);
    held.release();
    await checkpoint;
    expect((await engine.get({ checkpoint_id: "k2" })).latest).toBe(true);
  });

  it("a restore with another scope sent while one runs: invalid_phase once the first is restored, nothing sent for it", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "k0", episode_ids: R1, stop: false, controller_state: null });
    const held = fake.hold("resources", "r1", "restore");
    const first = engine.restore({ episode_ids: R1 });
    await held.reached;
    const second = refusalOf(engine.restore({ episode_ids: [{ rollout_id: "r2", attempt: 0 }] }));
    held.release();
    await first;
    expect((await second).code).toBe("invalid_phase");
    expect(fake.ops("restore")).toHaveLength(fake.members.length);
    expect(engine.openCheckpoint).toMatchObject({ checkpoint_id: "k0", phase: "restored" });
  });
});

describe("fine-grained ops on an id the convenience op is running", () => {
  it("commit sent while it runs is stale_checkpoint once it closed, publish gets the reply rebuilt from checkpoint.json: never a second commit or publication", async () => {
    const { engine, fake } = makeEngine(root);
    await engine.checkpoint({ checkpoint_id: "k0", episode_ids: R1, stop: false, controller_state: null });
    const held = fake.hold("resources", "r1", "prepare");
    const checkpoint = engine.checkpoint({ checkpoint_id: "k1", episode_ids: null, stop: false, controller_state: null });
    await held.reached;
    const commit = refusalOf(engine.commit({ checkpoint_id: "k1", episode_ids: null, stop: false }));
    const publish = engine.publish({ checkpoint_id: "k1", controller_state: null });
    const resume = engine.resume({ checkpoint_id: "k1" });
    held.release();
    expect((await commit).code).toBe("stale_checkpoint");
    const published = await checkpoint;
    expect(await publish).toEqual({ checkpoint_id: "k1", manifest_path: published.manifest_path, published_at: published.published_at, deleted: [] });
    await expect(resume).resolves.toEqual({ checkpoint_id: "k1", participants: [] });
    expect(fake.ops("commit").filter((c) => c.body.checkpoint_id === "k1")).toHaveLength(fake.members.length);
    expect(latest()).toBe("k1");
  });
});
