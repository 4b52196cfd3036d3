import { mkdtemp, readFile, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointError, canonicalDigest, sha256Hex, type PhaseOp, type RequestInputOf } from "../../../protocol/index.js";
import { FsCheckpointStorage } from "../../../participants/storage/fs-storage.js";
import { WriteGate } from "../../../participants/storage/write-gate.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { EnvironmentKind, EnvironmentRecordSchema, type StepEpisode } from "../../../participants/kinds/environment/index.js";
import { refusalCode, refusalOf } from "../../support/refusal.js";
import { ep } from "../../support/episode.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";

const TASK = { expression: "17 + 25", tool_rounds: 1 };
const flush = () => new Promise((resolve) => setImmediate(resolve));

let root: string;
const planes: ParticipantControlPlane[] = [];

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-env-"));
});
afterEach(async () => {
  for (const plane of planes.splice(0)) plane.dispose();
  await rm(root, { recursive: true, force: true });
});

function fresh() {
  const kind = new EnvironmentKind();
  const plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", leaseGraceSeconds: 60, checkpointRoot: root });
  planes.push(plane as unknown as ParticipantControlPlane);
  const call = <O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) => {
    const request: Record<string, unknown> = { deadline_ts: Date.now() / 1000 + 30, epoch: 1, ...body };
    if (op === "commit") Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), episode_ids: null, stop: false, ...body });
    if (op === "commit" && !("checkpoint_dir" in body)) createCheckpointDir(root, body.checkpoint_id);
    if (op === "restore") Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), ...body });
    return plane.handle(op, request as never);
  };
  return { kind, plane, call };
}

const code = (work: () => unknown) => refusalCode(work);

/** Episode code must observe its signal so retire can stop it. */
function abortable(promise: Promise<void>, signal: AbortSignal): Promise<void> {
  return Promise.race([promise, new Promise<void>((_, reject) => signal.addEventListener("abort", () => reject(signal.reason), { once: true }))]);
}

/** A three-step episode: invoke_agent (replay) → verify (wait) → return; agent work is gated by the test. */
function protocol(agentGate: Promise<void>, log: string[]) {
  return async (e: StepEpisode) => {
    let b = e.continuation() ?? { next: "invoke_agent" };
    log.push(`start:${e.key}:${String(b.next)}`);
    if (b.next === "invoke_agent") {
      await e.boundary(b);
      const answer = await e.step("replay", async (signal) => {
        await abortable(agentGate, signal);
        log.push(`agent:${e.key}`);
        return "42";
      });
      b = { next: "verify", answer };
      await e.boundary(b);
    }
    if (b.next === "verify") {
      const reward = await e.step("wait", async () => (b.answer === "42" ? 1 : 0));
      b = { next: "return", reward };
      await e.boundary(b);
    }
    return b.reward as number;
  };
}

/**
 * r1 parked in a replay step at its verify boundary, committed in c1 by one process (left parked
 * there), then restored and resumed in a fresh one: both, and the parking step for more episodes.
 */
async function restoredParkedR1() {
  const first = fresh();
  const hold = new Promise<void>(() => undefined);
  const parked = async (e: StepEpisode) => {
    await e.boundary({ next: "verify", answer: "42" });
    return e.step("replay", (signal) => abortable(hold, signal));
  };
  void first.kind.begin(ep("r1"), TASK, {}, parked).catch(() => undefined);
  await flush();
  await first.call("prepare", { checkpoint_id: "c1" });
  await first.call("commit", { checkpoint_id: "c1", episode_ids: [ep("r1")] });
  const second = fresh();
  await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("r1")] });
  await second.call("resume", { checkpoint_id: "c1" });
  return { first, second, parked };
}

describe("environment participant", () => {
  it("continues a crashed episode from its boundary; a second crash before re-dispatch continues as attempt+2", async () => {
    const log: string[] = [];
    const first = fresh();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const run = first.kind.begin(ep("r1"), TASK, {}, protocol(gate, log));
    void run.catch(() => undefined);
    await flush();
    expect((await first.call("prepare", { checkpoint_id: "c1" })).phase).toBe("prepared");
    const commit = await first.call("commit", { checkpoint_id: "c1", episode_ids: [ep("r1")] });
    expect(commit.episode_ids).toEqual(["r1"]);

    // crash: a fresh process restores c1; r1 is pending as r1-a1 until its replacement starts
    const second = fresh();
    expect(await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("r1")] })).toMatchObject({ restored: ["r1-a1"] });
    expect(second.kind.statusExtras()).toMatchObject({ restored_pending: 1 });
    await second.call("resume", { checkpoint_id: "c1" });
    expect((await second.call("prepare", { checkpoint_id: "c2" })).phase).toBe("prepared");
    const again = await second.call("commit", { checkpoint_id: "c2", episode_ids: [ep("r1", 1)] });
    expect(again.episode_ids).toEqual(["r1-a1"]);

    // second crash before the replacement started
    const third = fresh();
    expect(await third.call("restore", { checkpoint_id: "c2", episode_ids: [ep("r1", 1)] })).toMatchObject({ restored: ["r1-a2"] });
    await third.call("resume", { checkpoint_id: "c2" });
    expect(await code(() => third.kind.begin(ep("r1", 1), TASK, {}, protocol(Promise.resolve(), log)))).toBe("stale_attempt");
    const reward = await third.kind.begin(ep("r1", 2), TASK, {}, protocol(Promise.resolve(), log));
    expect(reward).toBe(1);
    expect(log).toEqual(["start:r1:invoke_agent", "start:r1-a2:invoke_agent", "agent:r1-a2"]);
    expect(third.kind.hasLiveState()).toBe(false);
    release();
  });

  it("refuses with documented codes and loses nothing: admission closed, digest mismatch, retired attempts, attempt conflicts", async () => {
    const { kind, call } = fresh();
    const hold = new Promise<void>(() => undefined);
    const running = kind.begin(ep("busy"), TASK, {}, protocol(hold, []));
    void running.catch(() => undefined);
    expect(await code(() => kind.begin(ep("busy", 1), TASK, {}, protocol(hold, [])))).toBe("stale_attempt");
    await flush();
    await call("prepare", { checkpoint_id: "c1" });
    expect(await code(() => kind.begin(ep("new"), TASK, {}, protocol(hold, [])))).toBe("admission_closed");
    await call("commit", { checkpoint_id: "c1" });
    await call("resume", { checkpoint_id: "c1" });

    const other = fresh();
    await other.call("restore", { checkpoint_id: "c1", episode_ids: [ep("busy")] });
    await other.call("resume", { checkpoint_id: "c1" });
    expect(await code(() => other.kind.begin(ep("busy", 1), { expression: "1 + 1", tool_rounds: 1 }, {}, protocol(hold, [])))).toBe("invalid_request");
    expect(other.kind.statusExtras()).toMatchObject({ restored_pending: 1, episodes: 0 });
    await other.call("retire", { checkpoint_id: "retire", episode_ids: [ep("busy", 1)] });
    expect(other.kind.statusExtras()).toMatchObject({ restored_pending: 0 });
    expect(await code(() => other.kind.begin(ep("busy", 1), TASK, {}, protocol(hold, [])))).toBe("stale_attempt");
    await other.call("forget", { checkpoint_id: "forget", rollout_ids: ["busy"] });
    await kind.retire([ep("busy")]);
  });

  it("a later attempt takes no restored record of another attempt: refused downstream, the record is still exported and continued", async () => {
    const { first, second } = await restoredParkedR1();
    expect(await code(() => second.kind.begin(ep("r1"), TASK, {}, async () => "from input"))).toBe("stale_attempt");
    // attempt+2 starts here from input, then its agent refuses it (the restored session is attempt+1's)
    const refusedDownstream = async () => {
      throw new CheckpointError("stale_attempt", "session r1 belongs to r1-a1");
    };
    expect(await code(() => second.kind.begin(ep("r1", 2), TASK, {}, refusedDownstream))).toBe("stale_attempt");
    expect(second.kind.statusExtras()).toMatchObject({ restored_pending: 1, episodes: 0 });
    await second.call("prepare", { checkpoint_id: "c2" });
    expect((await second.call("commit", { checkpoint_id: "c2", episode_ids: [ep("r1", 1)] })).episode_ids).toEqual(["r1-a1"]);
    await second.call("resume", { checkpoint_id: "c2" });
    // the real replacement continues from the restored boundary, as the agent does
    expect(await second.kind.begin(ep("r1", 1), TASK, {}, async (e) => e.continuation())).toEqual({ next: "verify", answer: "42" });
    expect(second.kind.hasLiveState()).toBe(false);
    await first.kind.retire([ep("r1")]);
  });

  it("restore refuses a record whose next attempt was retired here (stale_attempt, nothing installed); an attempt older than a restored one stays refused after forget lifts its fence", async () => {
    const first = fresh();
    const hold = new Promise<void>(() => undefined);
    void first.kind.begin(ep("r1"), TASK, {}, protocol(hold, [])).catch(() => undefined);
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    await first.call("commit", { checkpoint_id: "c1", episode_ids: [ep("r1")] });

    // A fresh process whose controller retired r1-a1 (dispatched after c1, lost) before restoring c1.
    const retiredFirst = fresh();
    await retiredFirst.call("retire", { checkpoint_id: "retire", episode_ids: [ep("r1", 1)] });
    expect(await code(() => retiredFirst.call("restore", { checkpoint_id: "c1", episode_ids: [ep("r1")] }))).toBe("stale_attempt");
    expect(retiredFirst.plane.currentPhase).toBe("idle");
    expect(retiredFirst.kind.hasLiveState()).toBe(false);
    expect(await code(() => retiredFirst.kind.begin(ep("r1", 1), TASK, {}, async () => "ran"))).toBe("stale_attempt");

    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("r1")] });
    await second.call("resume", { checkpoint_id: "c1" });
    await second.call("forget", { checkpoint_id: "forget", rollout_ids: ["r1"] });
    expect(second.plane.isRetired(ep("r1"))).toBe(false);
    expect(await code(() => second.kind.begin(ep("r1"), TASK, {}, async () => "from input"))).toBe("stale_attempt");
    expect(second.kind.statusExtras()).toMatchObject({ restored_pending: 1, episodes: 0 });
    expect(await second.kind.begin(ep("r1", 1), TASK, {}, async (e) => e.continuation())).toEqual({ next: "invoke_agent" });
    await first.call("resume", { checkpoint_id: "c1" });
    await first.kind.retire([ep("r1")]);
  });

  it("restore needs a fresh process: pending restored records count as live state (invalid_checkpoint_state, nothing installed over them)", async () => {
    const first = fresh();
    const hold = new Promise<void>(() => undefined);
    for (const id of ["a", "b"]) void first.kind.begin(ep(id), TASK, {}, protocol(hold, [])).catch(() => undefined);
    await flush();
    for (const c of ["c1", "c2"]) {
      await first.call("prepare", { checkpoint_id: c });
      await first.call("commit", { checkpoint_id: c, episode_ids: [ep(c === "c1" ? "a" : "b")] });
      await first.call("resume", { checkpoint_id: c });
    }
    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("a")] });
    await second.call("resume", { checkpoint_id: "c1" });
    expect(await code(() => second.call("restore", { checkpoint_id: "c2", episode_ids: [ep("b")] }))).toBe("invalid_checkpoint_state");
    expect(second.plane.currentPhase).toBe("idle");
    expect(second.kind.episodes.pendingKeys()).toEqual(["a-a1"]);
    await first.kind.retire([ep("a"), ep("b")]);
  });

  it("an episode finishing while prepared waits at {next:'return'} and delivers only after resume", async () => {
    const { kind, call } = fresh();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    let delivered: number | undefined;
    const run = kind
      .begin(ep("f1"), TASK, {}, async (e) => {
        await e.boundary({ next: "verify", answer: "42" });
        const reward = await e.step("wait", async () => {
          await gate;
          return 1;
        });
        await e.boundary({ next: "return", reward });
        return reward;
      })
      .then((reward) => (delivered = reward));
    await flush();
    const prepared = call("prepare", { checkpoint_id: "c1" });
    await flush();
    expect(kind.readiness().blockers).toEqual(["f1"]);
    release();
    expect((await prepared).phase).toBe("prepared");
    await flush();
    expect(delivered).toBeUndefined();
    const commit = await call("commit", { checkpoint_id: "c1" });
    const dir = join(root, "c1/gym/environment/env0");
    const records = (await readFile(join(dir, commit.manifest.records_file), "utf8")).trim().split("\n").map((l) => JSON.parse(l));
    expect(records).toEqual([{ episode_id: ep("f1"), task_digest: canonicalDigest(TASK), boundary: { next: "return", reward: 1 } }]);
    await call("resume", { checkpoint_id: "c1" });
    await run;
    expect(delivered).toBe(1);
  });

  it("commit clean-up drops pending restored records outside the scope", async () => {
    const first = fresh();
    const hold = new Promise<void>(() => undefined);
    for (const id of ["a", "b"]) void first.kind.begin(ep(id), TASK, {}, protocol(hold, [])).catch(() => undefined);
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    await first.call("commit", { checkpoint_id: "c1" });
    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("a"), ep("b")] });
    await second.call("resume", { checkpoint_id: "c1" });
    await second.call("prepare", { checkpoint_id: "c2" });
    const commit = await second.call("commit", { checkpoint_id: "c2", episode_ids: [ep("b", 1)] });
    expect(commit.episode_ids).toEqual(["b-a1"]);
    expect(second.kind.statusExtras()).toMatchObject({ restored_pending: 1 });
    // Freed, not fenced (delete_restored): the controller may still start a-a1, from input.
    expect(second.plane.isRetired(ep("a", 1))).toBe(false);
    expect(second.plane.status().retired_rollouts).toBe(0);
    await second.call("resume", { checkpoint_id: "c2" });
    const log: string[] = [];
    const restarted = second.kind.begin(ep("a", 1), TASK, {}, protocol(Promise.resolve(), log));
    expect(await restarted).toBe(1);
    expect(log[0]).toBe("start:a-a1:invoke_agent");
    await first.kind.retire([ep("a"), ep("b")]);
    await second.kind.retire([ep("b", 1)]);
  });

  // Reference §4.1: record lines keep the exporter's key order, and a restored episode sees its
  // state exactly as exported (some state is rendered back to the model by serializing it).
  it("a restored boundary keeps the exporter's key order, nested objects included, on disk and in the continuation", async () => {
    const boundary = { next: "verify", zeta: { b: 1, a: [{ d: 1, c: 2 }] }, answer: "42", alpha: null };
    const first = fresh();
    const hold = new Promise<void>(() => undefined);
    void first.kind
      .begin(ep("k1"), TASK, {}, async (e) => {
        await e.boundary(boundary);
        return e.step("replay", (signal) => abortable(hold, signal));
      })
      .catch(() => undefined);
    await flush();
    await first.call("prepare", { checkpoint_id: "c1" });
    await first.call("commit", { checkpoint_id: "c1", episode_ids: [ep("k1")] });
    const dir = join(root, "c1", "gym", "environment", "env0");
    const line = await readFile(join(dir, (await readdir(dir)).find((f) => f.startsWith("records-"))!), "utf8");
    expect(line).toContain(JSON.stringify(boundary));
    const second = fresh();
    await second.call("restore", { checkpoint_id: "c1", episode_ids: [ep("k1")] });
    await second.call("resume", { checkpoint_id: "c1" });
    let continued: unknown;
    await second.kind.begin(ep("k1", 1), TASK, {}, async (e) => {
      continued = e.continuation();
      return 1;
    });
    expect(JSON.stringify(continued)).toBe(JSON.stringify(boundary));
    await first.kind.retire([ep("k1")]);
  });

  it("corrupt restored records install nothing and leave the participant idle", async () => {
    const storage = new FsCheckpointStorage();
    const good = { episode_id: ep("g"), task_digest: canonicalDigest(TASK), boundary: { next: "verify", answer: "42" } };
    await storage.write({ checkpointDir: join(root, "bad"), checkpointId: "bad", kind: "environment", instance: "env0" }, [good, { episode_id: ep("h"), task_digest: "nope", boundary: null } as never], {
      gate: new WriteGate(),
      createdAt: 1,
      extra: {},
    });
    const { kind, plane, call } = fresh();
    expect(await code(() => call("restore", { checkpoint_id: "bad", episode_ids: [ep("g"), ep("h")] }))).toBe("invalid_checkpoint_state");
    expect(plane.currentPhase).toBe("idle");
    expect(kind.hasLiveState()).toBe(false);

    // a flipped byte in the records file is caught by the digest
    const dir = join(root, "c2/gym/environment/env0");
    await storage.write({ checkpointDir: join(root, "c2"), checkpointId: "c2", kind: "environment", instance: "env0" }, [good], { gate: new WriteGate(), createdAt: 1, extra: {} });
    const file = (await readdir(dir)).find((f) => f.startsWith("records-"))!;
    const text = await readFile(join(dir, file), "utf8");
    await writeFile(join(dir, file), text.replace("verify", "verifx"));
    expect(sha256Hex(await readFile(join(dir, file)))).not.toBe(file.slice(8, 72));
    expect(await code(() => call("restore", { checkpoint_id: "c2", episode_ids: [ep("g")] }))).toBe("invalid_checkpoint_state");
    expect(kind.hasLiveState()).toBe(false);
    expect(EnvironmentRecordSchema.safeParse(good).success).toBe(true);
  });
});

describe("one attempt per rollout in a checkpoint", () => {
  it("restore refuses records holding one rollout at two attempts (invalid_checkpoint_state naming both), installing nothing", async () => {
    const kind = new EnvironmentKind();
    kind.attach({ notifyReadinessChanged() {}, isRetired: () => false });
    const digest = canonicalDigest(TASK);
    const records = [
      { episode_id: ep("r2"), task_digest: digest, boundary: null },
      { episode_id: ep("r1"), task_digest: digest, boundary: { next: "verify" } },
      { episode_id: ep("r1", 1), task_digest: digest, boundary: { next: "return" } },
    ];
    const refusal = await refusalOf(() => kind.install(records));
    expect(refusal.code).toBe("invalid_checkpoint_state");
    expect(refusal.message).toContain("rollout r1 at attempts 0 and 1");
    expect(kind.episodes.pendingKeys()).toEqual([]);
    expect(kind.hasLiveState()).toBe(false);
  });

  it("a later attempt running beside a pending restored record is exported alone: never both attempts of the rollout", async () => {
    const { first, second, parked } = await restoredParkedR1();
    // attempt 2 starts from input beside the record pending as attempt 1 (begin keeps that record)
    void second.kind.begin(ep("r1", 2), TASK, {}, parked).catch(() => undefined);
    await flush();
    expect(second.kind.statusExtras()).toMatchObject({ restored_pending: 1, episodes: 1 });
    await second.call("prepare", { checkpoint_id: "c2" });
    // the running attempt is the rollout's current one: the pending record is not exported beside it
    expect((await second.call("commit", { checkpoint_id: "c2", episode_ids: null })).episode_ids).toEqual(["r1-a2"]);
    await second.call("resume", { checkpoint_id: "c2" });
    // a scope naming only the pending attempt still exports it (nothing else of r1 is in scope)
    await second.call("prepare", { checkpoint_id: "c3" });
    expect((await second.call("commit", { checkpoint_id: "c3", episode_ids: [ep("r1", 1)] })).episode_ids).toEqual(["r1-a1"]);
    await second.call("resume", { checkpoint_id: "c3" });
    await second.kind.retire([ep("r1", 2)]);
    await first.call("resume", { checkpoint_id: "c1" });
    await first.kind.retire([ep("r1")]);
  });
});

describe("environment readiness counts", () => {
  it("counts parked and replay_step episodes as exported: a restart parked at a boundary is not", async () => {
    const kind = new EnvironmentKind();
    let release!: () => void;
    const gate = new Promise<void>((resolve) => (release = resolve));
    const restart = kind.begin(ep("rs"), TASK, {}, async (e) => {
      await e.markRestart();
      await gate;
      await e.boundary({ next: "again" });
    });
    let releaseOther!: () => void;
    const otherGate = new Promise<void>((resolve) => (releaseOther = resolve));
    const exported = kind.begin(ep("ex"), TASK, {}, async (e) => {
      await otherGate;
      await e.boundary({ next: "again" });
    });
    await flush();
    await kind.closeAdmission();
    release();
    releaseOther();
    for (let i = 0; i < 50 && kind.episodes.steps.states().parked < 2; i++) await flush();
    expect(kind.episodes.steps.states().parked).toBe(2);
    expect(kind.readiness()).toMatchObject({ blockers: [], restarts: ["rs"], counts: { episodes: 2, parked: 1, replay_step: 0 } });
    expect((await kind.exportRecords(null)).map((r) => r.episode_id)).toEqual([ep("ex")]);
    await kind.openAdmission();
    await Promise.all([restart, exported]);
  });
});

describe("environment kind at scale", () => {
  /**
   * Many restored episodes (docs/benchmarks.md measures 10,000 parked ones per participant): each
   * start and each retired id must cost the same however many others are tracked or pending. An
   * episode id that counts reads of its rollout_id measures the work instead of the time: a start
   * that scans every pending record or tracked episode reads ~N²/2 of them (20,000 such starts
   * blocked the event loop for 8-13 s), an indexed one a few per episode.
   */
  it("starting and retiring N restored episodes reads each episode id a bounded number of times, not O(N) times", async () => {
    const n = 5_000;
    let reads = 0;
    const counted = (rolloutId: string, attempt: number) => ({
      get rollout_id() {
        reads += 1;
        return rolloutId;
      },
      attempt,
    });
    const kind = new EnvironmentKind();
    kind.attach({ notifyReadinessChanged() {}, isRetired: () => false });
    const digest = canonicalDigest(TASK);
    await kind.install(Array.from({ length: n }, (_, i) => ({ episode_id: ep(`r${i}`), task_digest: digest, boundary: { i } })));
    // Half start (and keep running), half stay pending: both kinds of state are large.
    const running: Promise<unknown>[] = [];
    for (let i = 0; i < n / 2; i++) {
      running.push(kind.begin(counted(`r${i}`, 1), TASK, {}, (e) => abortable(new Promise<void>(() => undefined), e.signal)).catch(() => undefined));
    }
    expect(kind.readiness().counts).toMatchObject({ episodes: n / 2, restored_pending: n / 2 });
    const startReads = reads;
    expect(startReads).toBeLessThan(20 * n);
    // One retire of every rollout: running ones stop, pending ones are dropped.
    await kind.retire(Array.from({ length: n }, (_, i) => counted(`r${i}`, 1)));
    await Promise.all(running);
    expect(kind.hasLiveState()).toBe(false);
    expect(reads - startReads).toBeLessThan(20 * n);
  });
});
