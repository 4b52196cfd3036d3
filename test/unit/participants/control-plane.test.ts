import { mkdir, mkdtemp, readdir, readFile, rename, rm, symlink, unlink, writeFile } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { basename, dirname, join } from "node:path";
import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointError, MAX_ATTEMPT, captureKey, nextAttempt, sha256Hex, type PhaseOp, type RequestInputOf } from "../../../protocol/index.js";
import { FsCheckpointStorage } from "../../../participants/storage/fs-storage.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import type { CheckpointStorage } from "../../../participants/storage/checkpoint-storage.js";
import type { ParticipantKind } from "../../../participants/control-plane/participant-kind.js";
import { refusalCode, refusalOf } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";
import { deferred } from "../../support/deferred.js";

const T0 = 1_700_000_000; // seconds; ManualClock starts here
const DEADLINE = T0 + 30;

let root: string;
let clock: ManualClock;
let kind: ScriptableKind;
let plane: ParticipantControlPlane;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-cp-"));
  clock = new ManualClock(T0 * 1000);
  kind = new ScriptableKind("environment");
  plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, leaseGraceSeconds: 60, checkpointRoot: root });
});

afterEach(async () => {
  plane.dispose();
  await rm(root, { recursive: true, force: true });
});

function call<O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) {
  const request = { deadline_ts: DEADLINE, epoch: 1, ...body };
  if (op === "commit") Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), episode_ids: null, stop: false, ...body });
  if (op === "commit" && !("checkpoint_dir" in body)) createCheckpointDir(root, body.checkpoint_id);
  return plane.handle(op, request as never);
}

const refused = refusalCode;

/** Lets promise chains started by timers run. */
const flush = () => new Promise((resolve) => setImmediate(resolve));

/** Holds the lock with a retire whose kind hook waits; the returned function releases it. */
async function holdLock() {
  const gate = deferred();
  kind.delay("retire", gate.promise);
  const holding = call("retire", { checkpoint_id: "hold", deadline_ts: T0 + 300, episode_ids: [{ rollout_id: "x", attempt: 0 }] });
  for (let i = 0; i < 10 && !kind.hooks().includes("retire"); i++) await flush();
  expect(kind.hooks()).toEqual(["retire"]);
  return async () => {
    gate.resolve();
    await holding;
  };
}

describe("phase machine", () => {
  it("runs prepare → commit → resume and writes records then manifest", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 }, { step: 3 });
    kind.addEpisode({ rollout_id: "r2", attempt: 2 }, { step: 1 });

    const prepared = await call("prepare", { checkpoint_id: "c1" });
    expect(prepared.phase).toBe("prepared");
    expect(kind.admissionOpen).toBe(false);

    const committed = await call("commit", { checkpoint_id: "c1" });
    expect(committed.episode_ids).toEqual(["r1", "r2-a2"]);
    expect(committed.manifest.record_count).toBe(2);
    expect(committed.manifest_path).toBe("gym/environment/env0/manifest.json");
    const files = await readdir(join(root, "c1/gym/environment/env0"));
    expect(files.sort()).toEqual(["manifest.json", committed.manifest.records_file]);
    expect(plane.currentPhase).toBe("committed");

    expect(await call("resume", { checkpoint_id: "c1" })).toEqual({ phase: "idle", idempotent: false });
    expect(kind.admissionOpen).toBe(true);
    expect(plane.status().checkpoint_id).toBeNull();
    expect(kind.hooks()).toEqual(["closeAdmission", "exportRecords", "openAdmission"]);
  });

  it("hands closeAdmission the time left to the closing op's deadline", async () => {
    const seen: (number | undefined)[] = [];
    const close = kind.closeAdmission.bind(kind);
    (kind as ParticipantKind).closeAdmission = async (options) => {
      seen.push(options?.timeLeftMs);
      await close();
    };
    await call("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 12 });
    expect(seen).toEqual([12_000]);
  });

  it("exports only the commit scope", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    kind.addEpisode({ rollout_id: "r2", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const reply = await call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r2", attempt: 0 }] });
    expect(reply.episode_ids).toEqual(["r2"]);
  });

  it("reports blockers at the deadline, capped at 100 with the full count, and keeps admission closed", async () => {
    kind.setBlockers(Array.from({ length: 150 }, (_, i) => `b${i}`));
    const pending = call("prepare", { checkpoint_id: "c1" });
    await flush();
    clock.advance(31_000);
    const reply = await pending;
    expect(reply.phase).toBe("preparing");
    expect(reply.report.ready).toBe(false);
    expect(reply.report.blockers).toHaveLength(100);
    expect(reply.report.blocker_count).toBe(150);
    expect(kind.admissionOpen).toBe(false);
    expect(plane.currentPhase).toBe("preparing");
  });

  it("a prepare whose closeAdmission throws goes back to idle with admission open, holding no id (phase and admission never disagree)", async () => {
    kind.failNext("closeAdmission", new Error("close failed"));
    await expect(call("prepare", { checkpoint_id: "c1" })).rejects.toThrow("close failed");
    expect(plane.currentPhase).toBe("idle");
    expect(plane.activeCheckpointId).toBeNull();
    expect(plane.status().lease_expires_at).toBeNull();
    expect(kind.admissionOpen).toBe(true);
    expect(kind.hooks()).toEqual(["closeAdmission", "openAdmission"]);
    // Not fenced (no resume happened): the same id, or another, prepares as usual.
    expect((await call("prepare", { checkpoint_id: "c1" })).phase).toBe("prepared");
  });

  it("finishes a waiting prepare as soon as the kind reports readiness", async () => {
    kind.setBlockers(["r1"]);
    const pending = call("prepare", { checkpoint_id: "c1" });
    await flush();
    kind.setBlockers([]);
    expect((await pending).phase).toBe("prepared");
  });

  it("a retried prepare whose readiness check throws while the first reaches prepared leaves it prepared (no idle participant answering a later retry prepared)", async () => {
    kind.setBlockers(["r1"]);
    const first = call("prepare", { checkpoint_id: "c1" });
    await flush();
    const retried = call("prepare", { checkpoint_id: "c1" });
    await flush();
    // Both wait; once unblocked, the first finds the kind ready and the retry's check throws.
    const readiness = kind.readiness.bind(kind);
    let checks = 0;
    kind.readiness = () => {
      if (++checks === 2) throw new Error("readiness failed");
      return readiness();
    };
    kind.setBlockers([]);
    expect((await first).phase).toBe("prepared");
    await expect(retried).rejects.toThrow("readiness failed");
    kind.readiness = readiness;
    expect(plane.currentPhase).toBe("prepared");
    expect(kind.admissionOpen).toBe(false);
    expect((await call("prepare", { checkpoint_id: "c1" })).phase).toBe("prepared");
    expect((await call("commit", { checkpoint_id: "c1" })).phase).toBe("committed");
  });

  it("a retried prepare still waiting on its poll timer when the checkpoint commits answers the prepared reply, not preparing (no answer contradicting the participant's state)", async () => {
    kind.setBlockers(["r1"]);
    const first = call("prepare", { checkpoint_id: "c1" });
    await flush();
    clock.advance(500);
    const retried = call("prepare", { checkpoint_id: "c1" });
    await flush();
    // Ready without a notification (the poll is there for a kind that sends none): the first's timer fires first.
    const readiness = kind.readiness.bind(kind);
    kind.readiness = () => ({ ...readiness(), blockers: [] });
    clock.advance(500);
    const prepared = await first;
    expect(prepared.phase).toBe("prepared");
    expect((await call("commit", { checkpoint_id: "c1" })).phase).toBe("committed");
    clock.advance(500); // the retry's poll timer
    expect(await retried).toEqual(prepared);
    expect(plane.currentPhase).toBe("committed");
  });

  it("returns cached replies for retried prepare and commit", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    const first = await call("prepare", { checkpoint_id: "c1" });
    expect(await call("prepare", { checkpoint_id: "c1" })).toBe(first);
    const commit = await call("commit", { checkpoint_id: "c1" });
    expect(await call("commit", { checkpoint_id: "c1" })).toBe(commit);
    expect(kind.hooks().filter((h) => h === "exportRecords")).toHaveLength(1);
  });
});

describe("fences and refusals change no state", () => {
  it.each([0, -1, Number.NaN, Number.POSITIVE_INFINITY])("refuses leaseGraceSeconds %s at construction: a lease must expire, at a time a renew can name", (leaseGraceSeconds) => {
    expect(() => new ParticipantControlPlane({ adapter: new ScriptableKind("agent"), instance: "a9", clock, leaseGraceSeconds })).toThrow(
      expect.objectContaining({ code: "invalid_request", message: expect.stringContaining("leaseGraceSeconds") }),
    );
  });

  it("refuses a relative checkpoint root at construction: checkpoint directories arrive absolute, so every commit would be refused", () => {
    const make = (checkpointRoot: string) => () => new ParticipantControlPlane({ adapter: new ScriptableKind("agent"), instance: "a9", clock, checkpointRoot });
    expect(make("ckpt")).toThrow(expect.objectContaining({ code: "invalid_request", message: expect.stringContaining("must be an absolute path") }));
    expect(make("./ckpt")).toThrow(/must be an absolute path/);
    expect(make(root)).not.toThrow();
  });

  it("refuses a conflicting checkpoint id", async () => {
    await call("prepare", { checkpoint_id: "c1" });
    const before = plane.status();
    expect(await refused(call("prepare", { checkpoint_id: "c2" }))).toBe("checkpoint_conflict");
    expect(await refused(call("resume", { checkpoint_id: "c2" }))).toBe("checkpoint_conflict");
    expect(plane.status()).toEqual(before);
  });

  it("fences resumed ids, and ids resumed before their prepare arrived", async () => {
    await call("prepare", { checkpoint_id: "c1" });
    await call("resume", { checkpoint_id: "c1" });
    expect(await refused(call("prepare", { checkpoint_id: "c1" }))).toBe("stale_checkpoint");
    expect(await call("resume", { checkpoint_id: "c1" })).toEqual({ phase: "idle", idempotent: true });

    expect(await call("resume", { checkpoint_id: "never-prepared" })).toEqual({ phase: "idle", idempotent: true });
    expect(await refused(call("prepare", { checkpoint_id: "never-prepared" }))).toBe("stale_checkpoint");
    expect(kind.admissionOpen).toBe(true);
  });

  it("answers a commit re-driven after its resume from the kept reply (the last 4 ids), changing nothing", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 }, { step: 3 });
    await call("prepare", { checkpoint_id: "c1" });
    const committed = await call("commit", { checkpoint_id: "c1" });
    await call("resume", { checkpoint_id: "c1" });
    const before = plane.status();
    // a successor completing the decision while the predecessor's publication was cut short
    expect(await call("commit", { checkpoint_id: "c1", epoch: 2 })).toEqual(committed);
    expect(plane.status()).toEqual({ ...before, epoch: 2 });
    expect(kind.admissionOpen).toBe(true);
    expect(kind.hooks().filter((h) => h === "exportRecords")).toHaveLength(1);
    expect(await refused(call("commit", { checkpoint_id: "c1", epoch: 2, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("checkpoint_conflict");
    // a checkpoint resumed before it committed stays refused
    await call("prepare", { checkpoint_id: "c2", epoch: 2 });
    await call("resume", { checkpoint_id: "c2", epoch: 2 });
    expect(await refused(call("commit", { checkpoint_id: "c2", epoch: 2 }))).toBe("stale_checkpoint");
    for (let i = 3; i <= 6; i++) {
      await call("prepare", { checkpoint_id: `c${i}`, epoch: 2 });
      await call("commit", { checkpoint_id: `c${i}`, epoch: 2 });
      await call("resume", { checkpoint_id: `c${i}`, epoch: 2 });
    }
    expect(await refused(call("commit", { checkpoint_id: "c1", epoch: 2 }))).toBe("stale_checkpoint");
    expect((await call("commit", { checkpoint_id: "c3", epoch: 2 })).manifest.checkpoint_id).toBe("c3");
    // only while the id is still in the resumed fence (the last 64)
    for (let i = 0; i < 64; i++) await call("resume", { checkpoint_id: `other${i}`, epoch: 2 });
    expect(await refused(call("commit", { checkpoint_id: "c6", epoch: 2 }))).toBe("invalid_phase");
  });

  it("remembers the last 64 resumed ids", async () => {
    for (let i = 0; i < 65; i++) await call("resume", { checkpoint_id: `old${i}` });
    expect(await refused(call("prepare", { checkpoint_id: "old64" }))).toBe("stale_checkpoint");
    expect((await call("prepare", { checkpoint_id: "old0" })).phase).toBe("prepared");
  });

  it("status samples restarts like blockers (full count in counts.restarts); prepare lists them all", async () => {
    const restarts = Array.from({ length: 30_000 }, (_, i) => `session-${String(i).padStart(6, "0")}-restart-only`);
    kind.setRestarts(restarts);
    const status = plane.status();
    expect(status.report.restarts).toEqual(restarts.slice(0, 100));
    expect(status.report.counts.restarts).toBe(30_000);
    expect(Buffer.byteLength(JSON.stringify(status))).toBeLessThan(64 * 1024);
    expect((await call("prepare", { checkpoint_id: "c1" })).report.restarts).toHaveLength(30_000);
  });

  it("refuses an epoch lower than the highest seen", async () => {
    await call("prepare", { checkpoint_id: "c1", epoch: 5 });
    const before = plane.status();
    expect(await refused(call("resume", { checkpoint_id: "c1", epoch: 4 }))).toBe("stale_epoch");
    expect(plane.status()).toEqual(before);
    expect((await call("resume", { checkpoint_id: "c1", epoch: 6 })).idempotent).toBe(false);
    expect(plane.status().epoch).toBe(6);
  });

  it("raises the epoch fence when a newer leader's commit is admitted, not when it succeeds: the old leader's resume cannot stop its write", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1", epoch: 5 });
    const gate = deferred();
    kind.delay("exportRecords", gate.promise); // the new leader's re-driven write is slow
    const commit = call("commit", { checkpoint_id: "c1", epoch: 6 });
    await waitUntil(() => kind.hooks().includes("exportRecords"), "the write to start"); // past the checkpoint_dir checks (fs)
    expect(await refused(call("resume", { checkpoint_id: "c1", epoch: 5 }))).toBe("stale_epoch");
    gate.resolve();
    expect((await commit).phase).toBe("committed");
    expect(plane.currentPhase).toBe("committed");
    expect(existsSync(join(root, "c1/gym/environment/env0/manifest.json"))).toBe(true);
  });

  it("re-checks the epoch once the lock is held: an older leader's op queued behind a newer one's is refused", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    kind.addEpisode({ rollout_id: "r2", attempt: 0 });
    const gate = deferred();
    kind.delay("retire", gate.promise);
    const holding = call("retire", { checkpoint_id: "retire", epoch: 1, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    for (let i = 0; i < 10 && !kind.hooks().includes("retire"); i++) await flush();
    expect(kind.hooks()).toEqual(["retire"]); // the first retire holds the lock
    // Both pass the fence on arrival (highest seen is 1) and queue on the lock, the newer leader's first.
    const newer = call("retire", { checkpoint_id: "retire", epoch: 6, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    const older = call("retire", { checkpoint_id: "retire", epoch: 5, episode_ids: [{ rollout_id: "r2", attempt: 0 }] });
    gate.resolve();
    await holding;
    expect(await newer).toEqual({ retired: ["r1"] });
    expect(await refused(older)).toBe("stale_epoch");
    expect(plane.isRetired({ rollout_id: "r2", attempt: 0 })).toBe(false);
    expect(kind.episodes.has("r2")).toBe(true);
    expect(plane.status().epoch).toBe(6);
  });

  it("a status carrying a newer leader's epoch raises the fence (a deposed leader's prepare queued on the lock is refused); a lower one is answered, not raised", async () => {
    const release = await holdLock(); // a retire at epoch 1 holds the lock
    // The deposed leader's delayed prepare passes the fence on arrival and queues on the lock.
    const stale = call("prepare", { checkpoint_id: "from-deposed", epoch: 1 });
    // The new leader's recovery probe.
    expect((await plane.handle("status", { epoch: 4 })).epoch).toBe(4);
    await release();
    expect(await refused(stale)).toBe("stale_epoch");
    expect({ phase: plane.currentPhase, active: plane.activeCheckpointId, admission: kind.admissionOpen }).toEqual({ phase: "idle", active: null, admission: true });
    expect(await refused(call("prepare", { checkpoint_id: "from-deposed", epoch: 3 }))).toBe("stale_epoch");
    // Read-only otherwise: a lower epoch (or none) changes nothing and is not refused.
    const before = plane.status();
    expect(await plane.handle("status", { epoch: 2 })).toEqual(before);
    expect(await plane.handle("status", {})).toEqual(before);
    expect((await call("prepare", { checkpoint_id: "c1", epoch: 4 })).phase).toBe("prepared");
  });

  it("an admitted op refused for its phase still raises the fence; one refused before admission does not", async () => {
    await call("prepare", { checkpoint_id: "c1", epoch: 5 });
    expect(await refused(call("commit", { checkpoint_id: "c1", epoch: 6, checkpoint_dir: "/outside/the/root" }))).toBe("invalid_request");
    expect(await refused(call("prepare", { checkpoint_id: "c1", epoch: 7, deadline_ts: T0 - 1 }))).toBe("deadline_exceeded");
    expect(plane.status().epoch).toBe(5);
    expect(await refused(call("prepare", { checkpoint_id: "c2", epoch: 6 }))).toBe("checkpoint_conflict");
    expect(plane.status().epoch).toBe(6);
    expect(await refused(call("resume", { checkpoint_id: "c1", epoch: 5 }))).toBe("stale_epoch");
    expect(plane.currentPhase).toBe("prepared");
  });

  it("refuses ops in the wrong phase", async () => {
    expect(await refused(call("commit", { checkpoint_id: "c1" }))).toBe("invalid_phase");
    expect(await refused(call("renew", { checkpoint_id: "c1" }))).toBe("invalid_phase");
    await call("prepare", { checkpoint_id: "c1" });
    expect(await refused(call("restore", { checkpoint_id: "c1", checkpoint_dir: join(root, "c1"), episode_ids: [] }))).toBe("invalid_phase");
    expect(await refused(call("retire", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r", attempt: 0 }] }))).toBe("invalid_phase");
    expect(await refused(call("forget", { checkpoint_id: "c1", rollout_ids: ["r"] }))).toBe("invalid_phase");
    expect(plane.status().retired_rollouts).toBe(0);
  });

  it("refuses a deadline further ahead than the protocol allows (milliseconds sent as seconds), changing nothing", async () => {
    expect(await refused(call("prepare", { checkpoint_id: "c1", deadline_ts: T0 * 1000 }))).toBe("invalid_request");
    expect(plane.currentPhase).toBe("idle");
    expect(kind.admissionOpen).toBe(true);
  });

  it("refuses a deadline already past", async () => {
    expect(await refused(call("prepare", { checkpoint_id: "c1", deadline_ts: T0 - 1 }))).toBe("deadline_exceeded");
    expect(plane.currentPhase).toBe("idle");
  });

  it("refuses commit when readiness regressed after prepare", async () => {
    await call("prepare", { checkpoint_id: "c1" });
    kind.setBlockers(["r9"]);
    expect(await refused(call("commit", { checkpoint_id: "c1" }))).toBe("invalid_phase");
    expect(plane.currentPhase).toBe("prepared");
    expect(existsSync(join(root, "c1", "gym"))).toBe(false);
  });

  it("refuses a scope that names a restart", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    kind.setRestarts(["r1"]);
    await call("prepare", { checkpoint_id: "c1" });
    expect(await refused(call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("restart_in_scope");
    expect(plane.currentPhase).toBe("prepared");
  });

  it("refuses a retried commit with another directory or scope", async () => {
    await call("prepare", { checkpoint_id: "c1" });
    const gate = deferred();
    kind.delay("exportRecords", gate.promise);
    const first = call("commit", { checkpoint_id: "c1" });
    await waitUntil(() => kind.hooks().includes("exportRecords"), "the first commit's export to start"); // past its checkpoint_dir checks (fs)
    expect(await refused(call("commit", { checkpoint_id: "c1", checkpoint_dir: join(root, "other") }))).toBe("checkpoint_conflict");
    expect(await refused(call("commit", { checkpoint_id: "c1", episode_ids: [] }))).toBe("checkpoint_conflict");
    gate.resolve();
    expect((await first).phase).toBe("committed");
  });

  it("refuses a commit retried with other arguments after it succeeded, instead of replaying the first reply", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    kind.addEpisode({ rollout_id: "r2", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const first = await call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(await call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] })).toEqual(first);
    expect(await refused(call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r2", attempt: 0 }] }))).toBe("checkpoint_conflict");
    expect(await refused(call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }], checkpoint_dir: join(root, "b") }))).toBe("checkpoint_conflict");
    expect(await refused(call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }], stop: true }))).toBe("checkpoint_conflict");
    expect(existsSync(join(root, "b"))).toBe(false);
  });

  it("a commit whose export failed leaves nothing behind: a corrected retry is accepted", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    kind.failNext("exportRecords", new CheckpointError("invalid_request", "a null scope is refused")); // as the model kind does
    await mkdir(join(root, "a"));
    await mkdir(join(root, "b"));
    expect(await refused(call("commit", { checkpoint_id: "c1", checkpoint_dir: join(root, "a") }))).toBe("invalid_request");
    const reply = await call("commit", { checkpoint_id: "c1", checkpoint_dir: join(root, "b"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(reply.episode_ids).toEqual(["r1"]);
    expect(existsSync(join(root, "b", "gym/environment/env0/manifest.json"))).toBe(true);
  });

  it("a refused commit does not extend the lease", async () => {
    await call("prepare", { checkpoint_id: "c1" });
    const lease = plane.status().lease_expires_at;
    kind.setBlockers(["r9"]);
    expect(await refused(call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 1000 }))).toBe("invalid_phase");
    expect(plane.status().lease_expires_at).toBe(lease);
  });

  it("refuses a null-scope commit at a participant that exports only a scope (scope_required) before anything changes: no export, no lease extension, no pending write", async () => {
    kind.scopeRequired = true;
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const lease = plane.status().lease_expires_at;
    expect(await refused(call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 1000, episode_ids: null }))).toBe("invalid_request");
    expect({ lease: plane.status().lease_expires_at, hooks: kind.hooks(), phase: plane.currentPhase }).toEqual({ lease, hooks: ["closeAdmission"], phase: "prepared" });
    // The scoped commit that follows goes ahead (in another directory: nothing pinned the first).
    await mkdir(join(root, "b"));
    const reply = await call("commit", { checkpoint_id: "c1", checkpoint_dir: join(root, "b"), episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(reply.episode_ids).toEqual(["r1"]);
  });

  it("refuses a commit whose reply could not be sent (an adapter's manifest extra and commit extras past one message) before publishing anything", async () => {
    // A manifest of ~800 KiB is within its readers' 1 MiB limit; with ~300 KiB of commit extras the
    // reply is past one NATS message: published, the endpoint would answer reply_too_large to every
    // try, and no checkpoint of this participant could ever complete.
    Object.assign(kind, { manifestExtra: () => ({ blob: "m".repeat(800 * 1024) }), commitExtras: () => ({ blob: "c".repeat(300 * 1024) }) });
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    expect(await refused(call("commit", { checkpoint_id: "c1" }))).toBe("payload_too_large");
    expect(existsSync(join(root, "c1", "gym/environment/env0/manifest.json"))).toBe(false);
    expect(plane.currentPhase).toBe("prepared");
  });

  it("refuses a checkpoint_dir outside the configured root", async () => {
    await call("prepare", { checkpoint_id: "c1" });
    expect(await refused(call("commit", { checkpoint_id: "c1", checkpoint_dir: "/etc/c1" }))).toBe("invalid_request");
  });

  it("refuses a commit while the configured root does not exist here (a shared filesystem not mounted) with storage_error, creating nothing: its records would land where no other process reads them", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    const mountPoint = join(root, "mnt");
    await mkdir(mountPoint);
    const unmounted = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, leaseGraceSeconds: 60, checkpointRoot: join(mountPoint, "ckpt") });
    try {
      const base = { checkpoint_id: "c1", deadline_ts: DEADLINE, epoch: 1 };
      await unmounted.handle("prepare", base as never);
      const lease = unmounted.status().lease_expires_at;
      const commit = { ...base, checkpoint_dir: join(mountPoint, "ckpt", "c1"), episode_ids: null, stop: false };
      const refusal = await refusalOf(unmounted.handle("commit", commit as never));
      expect(refusal.code).toBe("storage_error");
      expect(refusal.message).toContain(join(mountPoint, "ckpt"));
      expect({ created: await readdir(mountPoint), phase: unmounted.currentPhase, lease: unmounted.status().lease_expires_at }).toEqual({ created: [], phase: "prepared", lease });
      // Mounted (the coordinator created the checkpoint directory on the shared filesystem): the same commit goes ahead.
      await mkdir(join(mountPoint, "ckpt", "c1"), { recursive: true });
      expect(await unmounted.handle("commit", commit as never)).toMatchObject({ phase: "committed" });
    } finally {
      unmounted.dispose();
    }
  });

  it("refuses a commit into a checkpoint directory it does not see (made by the coordinator on storage not mounted here) with storage_error, changing nothing; once it is there the same commit goes ahead", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const before = plane.status(); // phase, active id, lease, epoch
    const dir = join(root, "c1");
    const refusal = await refusalOf(call("commit", { checkpoint_id: "c1", checkpoint_dir: dir, deadline_ts: DEADLINE + 1000 }));
    expect(refusal.code).toBe("storage_error");
    expect(refusal.message).toContain(dir);
    expect(refusal.message).toContain("mounted");
    // A file there is no checkpoint directory either (below the root, the path's check names it first).
    await writeFile(dir, "");
    expect(await refused(call("commit", { checkpoint_id: "c1", checkpoint_dir: dir, deadline_ts: DEADLINE + 1000 }))).toBe("invalid_request");
    expect({ status: plane.status(), phase: plane.currentPhase, hooks: kind.hooks(), files: await readdir(root) }).toEqual({
      status: before,
      phase: "prepared",
      hooks: ["closeAdmission"],
      files: ["c1"],
    });
    // Nothing cached or pinned: the same commit, once the directory is there.
    await unlink(dir);
    await mkdir(dir);
    expect((await call("commit", { checkpoint_id: "c1", checkpoint_dir: dir, deadline_ts: DEADLINE + 1000 })).phase).toBe("committed");
    expect(existsSync(join(dir, "gym/environment/env0/manifest.json"))).toBe(true);
  });

  it("refuses a commit into a missing checkpoint directory without a configured root as well", async () => {
    const rootless = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, leaseGraceSeconds: 60 });
    try {
      await rootless.handle("prepare", { checkpoint_id: "c1", deadline_ts: DEADLINE, epoch: 1 });
      const commit = { checkpoint_id: "c1", deadline_ts: DEADLINE, epoch: 1, checkpoint_dir: join(root, "c1"), episode_ids: null, stop: false };
      expect(await refused(rootless.handle("commit", commit))).toBe("storage_error");
      expect({ phase: rootless.currentPhase, files: await readdir(root) }).toEqual({ phase: "prepared", files: [] });
    } finally {
      rootless.dispose();
    }
  });

  it("a retried commit gets its kept reply even when the checkpoint directory no longer resolves (a storage hiccup at a successor's re-drive): the check refuses only what was not committed", async () => {
    const rootless = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, leaseGraceSeconds: 60 });
    try {
      kind.addEpisode({ rollout_id: "r1", attempt: 0 });
      await rootless.handle("prepare", { checkpoint_id: "c1", deadline_ts: DEADLINE, epoch: 1 });
      const dir = join(root, "c1");
      await mkdir(dir);
      const commit = { checkpoint_id: "c1", deadline_ts: DEADLINE, epoch: 1, checkpoint_dir: dir, episode_ids: null, stop: false };
      const first = await rootless.handle("commit", commit);
      expect(first.phase).toBe("committed");
      // The path now fails to resolve (ELOOP here; EIO or ESTALE on a network file system).
      await rename(dir, join(root, "c1-moved"));
      await symlink(dir, dir);
      expect(await rootless.handle("commit", commit)).toEqual(first);
    } finally {
      rootless.dispose();
    }
  });

  it("never creates the checkpoint directory itself: one gone between the check and the write (storage unmounted meanwhile) refuses the commit with storage_error, nothing made on the local disk", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const dir = join(root, "c1");
    await mkdir(dir);
    const gate = deferred();
    kind.delay("exportRecords", gate.promise);
    const committing = refusalOf(call("commit", { checkpoint_id: "c1", checkpoint_dir: dir, deadline_ts: DEADLINE + 1000 }));
    await waitUntil(() => kind.hooks().includes("exportRecords"), "the export");
    // The directory was visible when the commit arrived; the checkpoint storage goes away before the write.
    await rm(dir, { recursive: true });
    gate.resolve();
    const refusal = await committing;
    expect({ code: refusal.code, files: await readdir(root), phase: plane.currentPhase }).toEqual({ code: "storage_error", files: [], phase: "prepared" });
    // Once it is there again the same commit goes ahead.
    await mkdir(dir);
    expect((await call("commit", { checkpoint_id: "c1", checkpoint_dir: dir, deadline_ts: DEADLINE + 1000 })).phase).toBe("committed");
    expect(existsSync(join(dir, "gym/environment/env0/manifest.json"))).toBe(true);
  });

  it("refuses a checkpoint_dir that leaves the root through a symlink, before creating anything", async () => {
    const outside = await mkdtemp(join(tmpdir(), "gym-ckpt-outside-"));
    try {
      await symlink(outside, join(root, "escape"));
      await mkdir(join(root, "inside", "c1"), { recursive: true });
      await symlink(join(root, "inside"), join(root, "alias"));
      await call("prepare", { checkpoint_id: "c1" });
      expect(await refused(call("commit", { checkpoint_id: "c1", checkpoint_dir: join(root, "escape", "c1") }))).toBe("invalid_request");
      expect(await refused(call("commit", { checkpoint_id: "c1", checkpoint_dir: join(root, "escape") }))).toBe("invalid_request");
      expect(await readdir(outside)).toEqual([]);
      // A symlink that stays inside the root is fine.
      expect((await call("commit", { checkpoint_id: "c1", checkpoint_dir: join(root, "alias", "c1") })).phase).toBe("committed");
      expect(await readdir(join(root, "inside"))).toEqual(["c1"]);
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });

  it("refuses a commit whose directory leaves the root below checkpoint_dir (<dir>/gym a symlink out of it), writing nothing", async () => {
    const outside = await mkdtemp(join(tmpdir(), "gym-ckpt-outside-"));
    try {
      kind.addEpisode({ rollout_id: "r1", attempt: 0 });
      await call("prepare", { checkpoint_id: "c1" });
      await mkdir(join(root, "c1"));
      await symlink(outside, join(root, "c1", "gym"));
      expect(await refused(call("commit", { checkpoint_id: "c1" }))).toBe("invalid_request");
      // Deeper too: <dir>/gym/<kind> out of the root.
      await mkdir(join(root, "c2", "gym"), { recursive: true });
      await symlink(outside, join(root, "c2", "gym", "environment"));
      expect(await refused(call("commit", { checkpoint_id: "c1", checkpoint_dir: join(root, "c2") }))).toBe("invalid_request");
      expect(await readdir(outside)).toEqual([]);
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });

  it("refuses a commit or restore through a symlink below checkpoint_dir even when it stays inside the root: the coordinator's restore and verify refuse a participant directory reached through one, so its checkpoint could be published but never restored", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    await mkdir(join(root, "c1"));
    await mkdir(join(root, "elsewhere", "gym"), { recursive: true });
    await symlink(join(root, "elsewhere", "gym"), join(root, "c1", "gym"));
    expect(await refused(call("commit", { checkpoint_id: "c1" }))).toBe("invalid_request");
    expect(await readdir(join(root, "elsewhere", "gym"))).toEqual([]);
    expect(plane.currentPhase).toBe("prepared");
    // A restore through such a link installs nothing either.
    await call("resume", { checkpoint_id: "c1" });
    kind.episodes.clear(); // a fresh process, which a restore would install into
    const dir = await checkpointWith([{ rollout_id: "r2", attempt: 0 }]);
    await rename(join(dir, "gym"), join(root, "elsewhere", "src-gym"));
    await symlink(join(root, "elsewhere", "src-gym"), join(dir, "gym"));
    expect(await refused(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r2", attempt: 0 }] }))).toBe("invalid_request");
    expect(kind.restored.size).toBe(0);
  });

  it("checks the same below checkpoint_dir when the root is written unnormalized (`$DATA/ckpt` with DATA ending in /)", async () => {
    const outside = await mkdtemp(join(tmpdir(), "gym-ckpt-outside-"));
    const unnormalizedRoot = `${dirname(root)}//${basename(root)}`;
    const unnormalized = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, leaseGraceSeconds: 60, checkpointRoot: `${unnormalizedRoot}/` });
    try {
      kind.addEpisode({ rollout_id: "r1", attempt: 0 });
      await unnormalized.handle("prepare", { checkpoint_id: "c1", deadline_ts: DEADLINE, epoch: 1 } as never);
      await mkdir(join(root, "c1"));
      await symlink(outside, join(root, "c1", "gym"));
      const commit = { checkpoint_id: "c1", deadline_ts: DEADLINE, epoch: 1, episode_ids: null, stop: false };
      expect(await refused(unnormalized.handle("commit", { ...commit, checkpoint_dir: `${unnormalizedRoot}/c1` } as never))).toBe("invalid_request");
      expect(await readdir(outside)).toEqual([]);
      // A directory inside it, however the coordinator spells the root, is accepted.
      await mkdir(join(root, "c2"));
      expect(await unnormalized.handle("commit", { ...commit, checkpoint_dir: join(root, "c2") } as never)).toMatchObject({ phase: "committed" });
    } finally {
      unnormalized.dispose();
      await rm(outside, { recursive: true, force: true });
    }
  });

  it("refuses a checkpoint_dir that is a dangling symlink, or a participant directory holding a symlink, with invalid_request", async () => {
    await call("prepare", { checkpoint_id: "c1" });
    await symlink(join(root, "nowhere", "x"), join(root, "dangling"));
    expect(await refused(call("commit", { checkpoint_id: "c1", checkpoint_dir: join(root, "dangling") }))).toBe("invalid_request");
    await mkdir(join(root, "c1", "gym", "environment", "env0"), { recursive: true });
    await symlink("/etc/hostname", join(root, "c1", "gym", "environment", "env0", "manifest.json"));
    expect(await refused(call("commit", { checkpoint_id: "c1" }))).toBe("invalid_request");
    expect(await readdir(join(root, "c1", "gym", "environment", "env0"))).toEqual(["manifest.json"]);
    expect(existsSync(join(root, "nowhere"))).toBe(false);
  });

  it("refuses a restore whose <checkpoint_dir>/gym is a symlink to a checkpoint outside the root, installing nothing", async () => {
    const outside = await mkdtemp(join(tmpdir(), "gym-ckpt-outside-"));
    try {
      // A self-consistent checkpoint written outside the root (by a participant without one).
      const writerKind = new ScriptableKind("environment");
      writerKind.addEpisode({ rollout_id: "r1", attempt: 0 }, { planted: true });
      const writer = new ParticipantControlPlane({ adapter: writerKind, instance: "env0", clock });
      await writer.handle("prepare", { checkpoint_id: "c1", deadline_ts: DEADLINE, epoch: 1 });
      await mkdir(join(outside, "c1"));
      await writer.handle("commit", { checkpoint_id: "c1", deadline_ts: DEADLINE, epoch: 1, checkpoint_dir: join(outside, "c1"), episode_ids: null, stop: false });
      writer.dispose();
      await mkdir(join(root, "c1"));
      await symlink(join(outside, "c1", "gym"), join(root, "c1", "gym"));
      const scope = [{ rollout_id: "r1", attempt: 0 }];
      expect(await refused(call("restore", { checkpoint_id: "c1", checkpoint_dir: join(root, "c1"), episode_ids: scope }))).toBe("invalid_request");
      expect([...kind.restored.keys()]).toEqual([]);
      expect(plane.currentPhase).toBe("idle");
    } finally {
      await rm(outside, { recursive: true, force: true });
    }
  });
});

describe("incarnation fence", () => {
  const FOREIGN = "an-earlier-process";

  it("refuses a guarded op addressed to another incarnation before anything else, and changes nothing", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    const idle = plane.status();
    // idle: a prepare would close admission, a resume would fence the id
    expect(await refused(call("prepare", { checkpoint_id: "c1", incarnation: FOREIGN, epoch: 9 }))).toBe("stale_incarnation");
    expect(await refused(call("resume", { checkpoint_id: "c1", incarnation: FOREIGN, epoch: 9 }))).toBe("stale_incarnation");
    expect(plane.status()).toEqual(idle);
    expect(kind.admissionOpen).toBe(true);
    expect(kind.hooks()).toEqual([]);

    // prepared for c1 by this process: nothing addressed elsewhere commits, renews or resumes it
    const prepared = await call("prepare", { checkpoint_id: "c1", incarnation: plane.incarnation });
    expect(prepared.phase).toBe("prepared");
    const before = plane.status();
    expect(await refused(call("renew", { checkpoint_id: "c1", incarnation: FOREIGN, deadline_ts: DEADLINE + 1000 }))).toBe("stale_incarnation");
    expect(await refused(call("commit", { checkpoint_id: "c1", incarnation: FOREIGN }))).toBe("stale_incarnation");
    expect(await refused(call("resume", { checkpoint_id: "c1", incarnation: FOREIGN, epoch: 9 }))).toBe("stale_incarnation");
    expect(await refused(call("prepare", { checkpoint_id: "c1", incarnation: FOREIGN }))).toBe("stale_incarnation");
    expect(plane.status()).toEqual(before); // phase, active id, lease, epoch
    expect(existsSync(join(root, "c1", "gym"))).toBe(false);
    expect(kind.hooks()).toEqual(["closeAdmission"]);

    // the refused commit cached nothing: the real one exports, and the resume is not idempotent
    expect((await call("commit", { checkpoint_id: "c1", incarnation: plane.incarnation })).phase).toBe("committed");
    expect(await call("resume", { checkpoint_id: "c1" })).toEqual({ phase: "idle", idempotent: false });
    expect(kind.hooks()).toEqual(["closeAdmission", "exportRecords", "openAdmission"]);
  });

  it("a resume addressed to another incarnation does not fence the id here", async () => {
    expect(await refused(call("resume", { checkpoint_id: "c1", incarnation: FOREIGN }))).toBe("stale_incarnation");
    expect((await call("prepare", { checkpoint_id: "c1" })).phase).toBe("prepared");
  });

  it("a matching or absent incarnation works as before", async () => {
    const other = new ParticipantControlPlane({ adapter: new ScriptableKind("agent"), instance: "a0", incarnation: "given-1", clock, checkpointRoot: root });
    try {
      expect(other.incarnation).toBe("given-1");
      const ask = <O extends PhaseOp>(op: O, body: object) => other.handle(op, { checkpoint_id: "c1", deadline_ts: DEADLINE, epoch: 1, ...body } as never);
      expect((await ask("prepare", { incarnation: "given-1" })).phase).toBe("prepared");
      expect((await ask("renew", {})).lease_expires_at).toBe(DEADLINE + 600);
      await mkdir(join(root, "c1"));
      expect((await ask("commit", { incarnation: "given-1", checkpoint_dir: join(root, "c1"), episode_ids: null, stop: false })).phase).toBe("committed");
      expect(await ask("resume", { incarnation: "given-1" })).toEqual({ phase: "idle", idempotent: false });
    } finally {
      other.dispose();
    }
    expect(plane.incarnation).toMatch(/^[0-9a-f]{16}$/);
  });
});

describe("lease", () => {
  it("sets lease = max(current, deadline + grace)", async () => {
    await call("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 100 });
    expect(plane.status().lease_expires_at).toBe(T0 + 160);
    await call("renew", { checkpoint_id: "c1", deadline_ts: T0 + 50 });
    expect(plane.status().lease_expires_at).toBe(T0 + 160);
    expect(await call("renew", { checkpoint_id: "c1", deadline_ts: T0 + 200 })).toEqual({ lease_expires_at: T0 + 260 });
  });

  it("a prepare retried while still preparing extends the lease to its own deadline", async () => {
    kind.setBlockers(["r1"]);
    const first = call("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 10 });
    await flush();
    clock.advance(11_000);
    expect((await first).phase).toBe("preparing");
    expect(plane.status().lease_expires_at).toBe(T0 + 70);
    const retried = call("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 100 });
    await flush();
    expect(plane.status().lease_expires_at).toBe(T0 + 160);
    kind.setBlockers([]);
    expect((await retried).phase).toBe("prepared");
    // Past the first prepare's lease, the retry's keeps it open.
    clock.advance(80_000);
    await flush();
    expect(plane.currentPhase).toBe("prepared");
  });

  it("still expires when its timer fires before the wall clock reached the lease (timers are monotonic)", async () => {
    // A clock whose timers fire 5 ms early, as a monotonic timer does against a wall clock that lags.
    const early = new ManualClock(T0 * 1000);
    const eager = { now: () => early.now(), setTimer: (fn: () => void, ms: number) => early.setTimer(fn, ms - 5) };
    const p = new ParticipantControlPlane({ adapter: new ScriptableKind("environment"), instance: "env1", clock: eager, leaseGraceSeconds: 60, checkpointRoot: root });
    try {
      await p.handle("prepare", { checkpoint_id: "c1", deadline_ts: DEADLINE, epoch: 1 });
      // Up to 1 ms before the lease (DEADLINE + 60 s): the timer has fired, the lease has not expired.
      early.advance(90_000 - 1);
      await flush();
      await flush();
      expect(p.currentPhase).toBe("prepared");
      for (let i = 0; i < 5 && p.currentPhase !== "idle"; i++) {
        early.advance(30_000);
        await flush();
        await flush();
      }
      expect(p.currentPhase).toBe("idle");
    } finally {
      p.dispose();
    }
  });

  it("resumes by itself when the lease expires, and fences the id", async () => {
    await call("prepare", { checkpoint_id: "c1" });
    clock.advance(89_000);
    await flush();
    expect(plane.currentPhase).toBe("prepared");
    clock.advance(2_000);
    await flush();
    await flush();
    expect(plane.currentPhase).toBe("idle");
    expect(kind.admissionOpen).toBe(true);
    expect(await refused(call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 200 }))).toBe("stale_checkpoint");
  });
});

describe("export once per checkpoint, across failures", () => {
  /** Storage whose writes the test fails or holds, counting them. */
  function scriptedStorage() {
    const fs = new FsCheckpointStorage();
    const script = { writes: 0, failNext: false, failAfterHold: false, hold: undefined as Promise<void> | undefined };
    const noSpace = () => Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", syscall: "write" });
    const storage: CheckpointStorage = {
      async write(target, records, options) {
        script.writes += 1;
        if (script.failNext) {
          script.failNext = false;
          throw noSpace();
        }
        if (script.hold) await script.hold;
        if (script.failAfterHold) {
          script.failAfterHold = false;
          throw noSpace();
        }
        return fs.write(target, records, options);
      },
      read: (...args) => fs.read(...args),
    };
    plane.dispose();
    plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, storage, leaseGraceSeconds: 60, checkpointRoot: root });
    return script;
  }

  const exports = () => kind.hooks().filter((hook) => hook === "exportRecords").length;

  it("a retry after a failed store re-stores the same records without exporting again", async () => {
    const script = scriptedStorage();
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    script.failNext = true;
    await expect(call("commit", { checkpoint_id: "c1" })).rejects.toThrow(/ENOSPC/);
    kind.addEpisode({ rollout_id: "r2", attempt: 0 }); // what a second export would pick up
    const reply = await call("commit", { checkpoint_id: "c1" });
    expect(reply.episode_ids).toEqual(["r1"]);
    expect(exports()).toBe(1);
    expect(script.writes).toBe(2);
  });

  it("a write that outlives its deadline fails the call and keeps running; the retry awaits that same write", async () => {
    const script = scriptedStorage();
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const hold = deferred();
    script.hold = hold.promise;
    const first = call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 10 });
    await waitUntil(() => script.writes === 1, "the write to start");
    clock.advance(10_000);
    expect(await refused(first)).toBe("deadline_exceeded");
    expect(plane.currentPhase).toBe("prepared");
    kind.addEpisode({ rollout_id: "r2", attempt: 0 });
    const retry = call("commit", { checkpoint_id: "c1" });
    for (let i = 0; i < 5; i++) await flush();
    hold.resolve();
    expect((await retry).episode_ids).toEqual(["r1"]);
    expect(exports()).toBe(1);
    expect(script.writes).toBe(1);
  });

  it("a commit whose write fails puts back the lease it had (a failed commit extends nothing); a renew meanwhile still counts", async () => {
    const script = scriptedStorage();
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" }); // lease DEADLINE + 60
    const lease = plane.status().lease_expires_at;
    expect(lease).toBe(DEADLINE + 60);
    script.failNext = true;
    await expect(call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 1000 })).rejects.toThrow(/ENOSPC/);
    expect(plane.status().lease_expires_at).toBe(lease);
    // A renew while a later write runs is the coordinator's own extension: the failure keeps it.
    const hold = deferred();
    script.hold = hold.promise;
    script.failAfterHold = true;
    const second = call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 1000 }).then(
      () => "committed",
      (error: Error) => error.message,
    );
    await waitUntil(() => script.writes === 2, "the second write to start");
    expect(plane.status().lease_expires_at).toBe(T0 + 1060); // the running write is covered to its deadline
    await call("renew", { checkpoint_id: "c1", deadline_ts: T0 + 500 });
    hold.resolve();
    expect(await second).toMatch(/ENOSPC/);
    expect(plane.status().lease_expires_at).toBe(T0 + 560);
    // And it expires then, as a lease does: the participant no longer stays parked under the commit's.
    clock.advance(561_000);
    for (let i = 0; i < 5 && plane.currentPhase !== "idle"; i++) await flush();
    expect(plane.currentPhase).toBe("idle");
    expect(kind.admissionOpen).toBe(true);
  });
});

// Lease expiry cannot overtake a readiness wait (the lease is at least the deadline + grace, and the
// wait ends at the deadline); it reopens through the same path as resume (see "lease").
describe("resume aborts a prepare that waits for readiness", () => {
  it("a resume is answered at once, reopens admission, and the waiting prepare replies idle", async () => {
    kind.setBlockers(["r1"]);
    const prepare = call("prepare", { checkpoint_id: "c1" });
    await waitUntil(() => kind.hooks().includes("closeAdmission"), "prepare to close admission");
    // A newer leader's resume (no clock advance: it need not wait for prepare's deadline).
    expect(await call("resume", { checkpoint_id: "c1", epoch: 2 })).toEqual({ phase: "idle", idempotent: false });
    expect(kind.admissionOpen).toBe(true);
    expect((await prepare).phase).toBe("idle");
    expect(await refused(call("prepare", { checkpoint_id: "c1", epoch: 2 }))).toBe("stale_checkpoint");
  });
});

// A stopping process (shutdown, or its name taken over) waits for the answers being computed: a
// prepare waiting for readiness must not hold it until its deadline, nor ever answer prepared.
describe("stopping ends a prepare that waits for readiness", () => {
  it("the waiting prepare answers at once as not prepared, with its blockers (no clock advance)", async () => {
    kind.setBlockers(["r1"]);
    const prepare = call("prepare", { checkpoint_id: "c1" });
    await waitUntil(() => kind.hooks().includes("closeAdmission"), "prepare to close admission");
    plane.beginStopping();
    const reply = await prepare;
    expect({ phase: reply.phase, blockers: reply.report.blockers }).toEqual({ phase: "preparing", blockers: ["r1"] });
    expect(plane.currentPhase).toBe("preparing");
  });

  it("readiness reached as it stops still answers preparing: a stopping process cannot commit", async () => {
    kind.setBlockers(["r1"]);
    const prepare = call("prepare", { checkpoint_id: "c1" });
    await waitUntil(() => kind.hooks().includes("closeAdmission"), "prepare to close admission");
    plane.beginStopping();
    kind.setBlockers([]);
    expect((await prepare).phase).toBe("preparing");
    expect(plane.currentPhase).toBe("preparing");
  });

  it("dispose stops it too", async () => {
    kind.setBlockers(["r1"]);
    const prepare = call("prepare", { checkpoint_id: "c1" });
    await waitUntil(() => kind.hooks().includes("closeAdmission"), "prepare to close admission");
    plane.dispose();
    expect((await prepare).phase).toBe("preparing");
  });
});

describe("after-commit hook (restored clean-up, parking on stop)", () => {
  /** A kind whose afterCommit waits for `gate`, recording when it started. */
  function hookWaitingFor(gate: Promise<void>) {
    const seen = { entered: false };
    Object.assign(kind, {
      afterCommit: async () => {
        seen.entered = true;
        await gate;
      },
    });
    return seen;
  }

  async function committing(stop = true) {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    let settled: string | undefined;
    const commit = call("commit", { checkpoint_id: "c1", stop });
    void commit.then(
      (reply) => (settled = reply.phase),
      (error: unknown) => (settled = `refused ${String(error)}`),
    );
    return { commit, settled: () => settled };
  }

  it("the reply waits for a hook that finishes before the deadline", async () => {
    const gate = deferred();
    const seen = hookWaitingFor(gate.promise);
    const { commit, settled } = await committing();
    await waitUntil(() => seen.entered, "the hook to start");
    for (let i = 0; i < 5; i++) await flush();
    expect(settled()).toBeUndefined();
    gate.resolve();
    expect((await commit).phase).toBe("committed");
  });

  it("a hook that never returns neither holds the reply past the deadline nor blocks resume (the park is best effort)", async () => {
    const seen = hookWaitingFor(new Promise<void>(() => undefined));
    const { commit, settled } = await committing();
    await waitUntil(() => seen.entered, "the hook to start");
    expect(plane.currentPhase).toBe("committed");
    // The resume is answered while the hook still hangs: it does not wait for the lock.
    expect(await call("resume", { checkpoint_id: "c1", deadline_ts: T0 + 60 })).toEqual({ phase: "idle", idempotent: false });
    expect(kind.admissionOpen).toBe(true);
    expect(settled()).toBeUndefined();
    clock.advance(30_000); // the commit's deadline
    expect((await commit).phase).toBe("committed");
    expect(existsSync(join(root, "c1/gym/environment/env0/manifest.json"))).toBe(true);
  });

  it("a hook that never returns does not keep the lease from expiring", async () => {
    const seen = hookWaitingFor(new Promise<void>(() => undefined));
    const { commit } = await committing();
    await waitUntil(() => seen.entered, "the hook to start");
    clock.advance(30_000);
    expect((await commit).phase).toBe("committed");
    clock.advance(61_000); // past deadline + grace
    await waitUntil(() => plane.currentPhase === "idle", "the lease to expire", 2_000);
    expect(kind.admissionOpen).toBe(true);
    expect(await refused(call("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 200 }))).toBe("stale_checkpoint");
  });
});

describe("resume stops a pending write", () => {
  it("publishes no manifest after resume", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const gate = deferred();
    kind.delay("exportRecords", gate.promise);
    const commit = call("commit", { checkpoint_id: "c1" });
    await flush();
    await call("resume", { checkpoint_id: "c1" });
    gate.resolve();
    expect(await refused(commit)).toBe("stale_checkpoint");
    expect(existsSync(join(root, "c1/gym/environment/env0/manifest.json"))).toBe(false);
  });
});

describe("retire and forget", () => {
  it("marks retired attempts until forget", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 1 });
    const reply = await call("retire", { checkpoint_id: "retire", episode_ids: [{ rollout_id: "r1", attempt: 1 }] });
    expect(reply).toEqual({ retired: ["r1-a1"] });
    expect(kind.episodes.size).toBe(0);
    expect(plane.isRetired({ rollout_id: "r1", attempt: 0 })).toBe(true);
    expect(plane.isRetired({ rollout_id: "r1", attempt: 2 })).toBe(false);
    expect(() => plane.assertNotRetired({ rollout_id: "r1", attempt: 1 })).toThrow(/retired/);
    expect(plane.status().retired_rollouts).toBe(1);
    // A later retire of a lower attempt (a retried or delayed one) never lowers the mark.
    await call("retire", { checkpoint_id: "retire", episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(plane.isRetired({ rollout_id: "r1", attempt: 1 })).toBe(true);
    expect(await call("forget", { checkpoint_id: "forget", rollout_ids: ["r1", "r1"] })).toEqual({ forgotten: ["r1"] });
    expect(plane.isRetired({ rollout_id: "r1", attempt: 1 })).toBe(false);
    expect(plane.status().retired_rollouts).toBe(0);
  });

  // Reference §3.3: retire answers the capture keys it retired, forget the rollout ids, sorted.
  it("retire and forget replies list their capture keys and rollout ids sorted, each once", async () => {
    const episodes = [{ rollout_id: "r2", attempt: 0 }, { rollout_id: "r10", attempt: 3 }, { rollout_id: "r1", attempt: 1 }, { rollout_id: "r2", attempt: 0 }];
    expect(await call("retire", { checkpoint_id: "retire", episode_ids: episodes })).toEqual({ retired: ["r1-a1", "r10-a3", "r2"] });
    expect(await call("forget", { checkpoint_id: "forget", rollout_ids: ["r2", "r10", "r1", "r2"] })).toEqual({ forgotten: ["r1", "r10", "r2"] });
  });
});

describe("retire marks before it stops", () => {
  it("refuses the attempt while its work is still being stopped, and keeps the mark when the retire overruns its deadline", async () => {
    kind.addEpisode({ rollout_id: "r3", attempt: 1 });
    const gate = deferred();
    kind.delay("retire", gate.promise); // stopping the work takes long
    const retire = call("retire", { checkpoint_id: "retire", deadline_ts: T0 + 10, episode_ids: [{ rollout_id: "r3", attempt: 1 }] });
    for (let i = 0; i < 10 && !kind.hooks().includes("retire"); i++) await flush();
    expect(kind.hooks()).toEqual(["retire"]); // the retire is in its hook: the mark is already set
    // A request the caller sent just before its own retire, arriving now, is already refused.
    expect(() => plane.assertNotRetired({ rollout_id: "r3", attempt: 1 })).toThrow(/retired/);
    clock.advance(20_000);
    expect(await refused(retire)).toBe("deadline_exceeded");
    expect(plane.isRetired({ rollout_id: "r3", attempt: 1 })).toBe(true);
    expect(plane.status().retired_rollouts).toBe(1);
    gate.resolve();
  });
});

describe("forget whose kind hook hangs", () => {
  it("answers deadline_exceeded at its deadline and keeps the marks, without holding the lock: a prepare after it goes ahead", async () => {
    await call("retire", { checkpoint_id: "retire", episode_ids: [{ rollout_id: "r4", attempt: 0 }] });
    kind.delay("forget", new Promise<void>(() => undefined)); // freeing held state from a provider that never answers
    const forget = call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 10, rollout_ids: ["r4"] });
    for (let i = 0; i < 10 && !kind.hooks().includes("forget"); i++) await flush();
    expect(kind.hooks()).toEqual(["retire", "forget"]); // the forget is in its hung hook, past the early checks
    clock.advance(20_000);
    expect(await refused(forget)).toBe("deadline_exceeded");
    expect(plane.isRetired({ rollout_id: "r4", attempt: 0 })).toBe(true);
    // The lock is free: the next checkpoint (and a resume, a lease expiry) is not queued behind the hook.
    expect((await call("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 60 })).phase).toBe("prepared");
  });
});

describe("a deadline that passes while the op waits for the lock", () => {
  // The early check, before the lock: a retire that arrives already late is answered at once, not
  // after whatever op holds the lock (a hung kind hook) lets go.
  it("refuses a retire already past its deadline at once, without queueing for the lock", async () => {
    const release = await holdLock();
    const late = refused(call("retire", { checkpoint_id: "retire", deadline_ts: T0 - 1, episode_ids: [{ rollout_id: "r2", attempt: 0 }] }));
    const outcome = await Promise.race([
      late,
      (async () => {
        for (let i = 0; i < 20; i++) await flush();
        return "queued behind the lock";
      })(),
    ]);
    await release();
    expect(outcome).toBe("deadline_exceeded");
  });

  it("refuses a queued retire with deadline_exceeded before marking anything", async () => {
    kind.addEpisode({ rollout_id: "r2", attempt: 0 });
    const release = await holdLock();
    const queued = call("retire", { checkpoint_id: "retire", deadline_ts: T0 + 10, episode_ids: [{ rollout_id: "r2", attempt: 0 }] });
    await flush();
    clock.advance(20_000);
    await release();
    expect(await refused(queued)).toBe("deadline_exceeded");
    expect(plane.isRetired({ rollout_id: "r2", attempt: 0 })).toBe(false);
    expect(plane.status().retired_rollouts).toBe(1); // only the holding retire's mark
    expect(kind.hooks()).toEqual(["retire"]);
    expect(kind.episodes.has("r2")).toBe(true);
  });

  it("refuses a queued prepare with deadline_exceeded instead of closing admission", async () => {
    const release = await holdLock();
    const queued = call("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 10 });
    await flush();
    clock.advance(20_000);
    await release();
    expect(await refused(queued)).toBe("deadline_exceeded");
    expect(kind.admissionOpen).toBe(true);
    expect(plane.currentPhase).toBe("idle");
    expect(kind.hooks()).toEqual(["retire"]);
  });
});

/** A checkpoint `id` (in `root`) whose environment records hold `episodes`. */
async function checkpointWith(episodes: { rollout_id: string; attempt: number }[], id = "src"): Promise<string> {
  const source = new ScriptableKind("environment");
  const writer = new ParticipantControlPlane({ adapter: source, instance: "env0", clock, checkpointRoot: root });
  for (const e of episodes) source.addEpisode(e, { at: e.rollout_id });
  await writer.handle("prepare", { checkpoint_id: id, deadline_ts: DEADLINE, epoch: 1 });
  createCheckpointDir(root, id);
  await writer.handle("commit", { checkpoint_id: id, deadline_ts: DEADLINE, epoch: 1, checkpoint_dir: join(root, id), episode_ids: null, stop: false });
  writer.dispose();
  return join(root, id);
}

describe("restore", () => {
  it("installs the scoped records as attempt+1", async () => {
    const dir = await checkpointWith([
      { rollout_id: "r1", attempt: 0 },
      { rollout_id: "r2", attempt: 1 },
    ]);
    const reply = await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r2", attempt: 1 }] });
    expect(reply).toEqual({ phase: "restored", source_checkpoint_id: "src", restored: ["r2-a2"], incarnation: plane.incarnation });
    expect([...kind.restored.keys()]).toEqual(["r2-a2"]);
    expect(plane.currentPhase).toBe("restored");
    await call("resume", { checkpoint_id: "src" });
    expect(kind.admissionOpen).toBe(true);
  });

  it("a resume of the source checkpoint addressed to an earlier incarnation does not fence its restore", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    expect(await refused(call("resume", { checkpoint_id: "src", incarnation: "the-process-that-wrote-it" }))).toBe("stale_incarnation");
    const reply = await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(reply.restored).toEqual(["r1-a1"]);
  });

  it("refuses a restore retried with another scope after it succeeded", async () => {
    const dir = await checkpointWith([
      { rollout_id: "r1", attempt: 0 },
      { rollout_id: "r2", attempt: 0 },
    ]);
    const first = await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] })).toEqual(first);
    expect(await refused(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r2", attempt: 0 }] }))).toBe("checkpoint_conflict");
    expect([...kind.restored.keys()]).toEqual(["r1-a1"]);
  });

  it("refuses a restore when live state appeared while its records were read, and reopens admission", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const gate = deferred();
    const reading = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    kind.delay("closeAdmission", gate.promise);
    await flush();
    kind.addEpisode({ rollout_id: "late", attempt: 0 }); // admitted before admission closed
    gate.resolve();
    expect(await refused(reading)).toBe("invalid_checkpoint_state");
    expect(kind.restored.size).toBe(0);
    expect(kind.admissionOpen).toBe(true);
    expect(plane.currentPhase).toBe("idle");
  });

  it("reopens admission when closing it fails during a restore (the phase stays idle: no resume would reopen it)", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    // As the model kind does: stop admitting first, then fail while cutting what is in flight.
    kind.closeAdmission = async () => {
      kind.calls.push({ hook: "closeAdmission", at: Date.now() });
      kind.admissionOpen = false;
      throw new Error("cut runner failed");
    };
    await expect(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] })).rejects.toThrow(/cut runner/);
    expect(kind.hooks()).toEqual(["closeAdmission", "openAdmission"]);
    expect(kind.admissionOpen).toBe(true);
    expect(plane.currentPhase).toBe("idle");
    expect(kind.restored.size).toBe(0);
  });

  it("refuses a restore whose deadline passed while it waited for the lock, before closing admission or installing", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const release = await holdLock();
    const queued = call("restore", { checkpoint_id: "src", deadline_ts: T0 + 10, checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await flush();
    clock.advance(20_000);
    await release();
    expect(await refused(queued)).toBe("deadline_exceeded");
    expect(kind.hooks()).toEqual(["retire"]);
    expect(plane.currentPhase).toBe("idle");
    expect(plane.status().lease_expires_at).toBeNull();
  });

  it("refuses a scope at the last attempt (MAX_ATTEMPT) with invalid_request, changing nothing: its next attempt has no capture key, so its state could neither be exported again nor retired", async () => {
    const last = { rollout_id: "r1", attempt: MAX_ATTEMPT };
    const dir = await checkpointWith([last]);
    const before = plane.status();
    expect(await refused(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r0", attempt: 0 }, last] }))).toBe("invalid_request");
    expect({ status: plane.status(), hooks: kind.hooks(), restored: kind.restored.size, fenced: plane.isRetired(last) }).toEqual({ status: before, hooks: [], restored: 0, fenced: false });
    // one below continues as MAX_ATTEMPT
    await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: MAX_ATTEMPT - 1 }] });
  });

  it("refuses a scope naming one rollout at two attempts with invalid_request, changing nothing: each would continue, the lower one fenced at once by the higher", async () => {
    const dir = await checkpointWith([
      { rollout_id: "r1", attempt: 0 },
      { rollout_id: "r1", attempt: 1 },
    ]);
    const before = plane.status();
    const scope = [
      { rollout_id: "r1", attempt: 0 },
      { rollout_id: "r1", attempt: 1 },
    ];
    expect(await refused(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope }))).toBe("invalid_request");
    expect({ status: plane.status(), hooks: kind.hooks(), restored: kind.restored.size, fenced: plane.isRetired(scope[0]!) }).toEqual({ status: before, hooks: [], restored: 0, fenced: false });
    const reply = await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [scope[1]!] });
    expect(reply.restored).toEqual(["r1-a2"]);
  });

  it("refuses to restore into a process with live state", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    kind.addEpisode({ rollout_id: "live", attempt: 0 });
    expect(await refused(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [] }))).toBe("invalid_checkpoint_state");
    expect(plane.currentPhase).toBe("idle");
  });

  it("installs nothing from corrupted records and stays idle", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const pdir = join(dir, "gym/environment/env0");
    const recordsFile = (await readdir(pdir)).find((f) => f.startsWith("records-"))!;
    const { writeFile } = await import("node:fs/promises");
    const text = await readFile(join(pdir, recordsFile), "utf8");
    await writeFile(join(pdir, recordsFile), text.replace('"r1"', '"r9"'));
    expect(await refused(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe(
      "invalid_checkpoint_state",
    );
    expect(kind.hooks()).not.toContain("install");
    expect(plane.currentPhase).toBe("idle");
    expect(kind.admissionOpen).toBe(true);
  });

  it("reopens admission when install fails", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    kind.failNext("install");
    await expect(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] })).rejects.toThrow(/install/);
    expect(plane.currentPhase).toBe("idle");
    expect(kind.admissionOpen).toBe(true);
    expect(kind.hooks()).toEqual(["closeAdmission", "install", "openAdmission"]);
  });

  it("an install that fails with a refusal code after installing part of the restore answers internal_error (the coordinator's clean-up must retire attempt+1 here), and the same restore sent again gets it too", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const install = kind.install.bind(kind);
    kind.install = async (records) => {
      kind.install = install;
      await install(records);
      throw new CheckpointError("invalid_checkpoint_state", "scripted: a later record does not validate");
    };
    const restore = () => call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    const failure = await restore().catch((error: unknown) => error as CheckpointError);
    expect(failure).toMatchObject({ code: "internal_error", message: expect.stringContaining("invalid_checkpoint_state") });
    expect(kind.hasLiveState()).toBe(true);
    expect(await refused(restore())).toBe("internal_error");
  });

  it("a failed restore whose reopen of admission fails once still reopens (no resume or lease would: the phase stays idle), and answers the restore's own refusal", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    kind.failNext("install", new CheckpointError("invalid_checkpoint_state", "scripted: a record does not validate"));
    kind.failNext("openAdmission", new Error("transient reopen failure"));
    expect(await refused(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("invalid_checkpoint_state");
    expect(plane.currentPhase).toBe("idle");
    // The coordinator's clean-up resumes the id here: idle, so that changes nothing.
    await call("resume", { checkpoint_id: "src" });
    for (let i = 0; i < 5 && !kind.admissionOpen; i++) {
      clock.advance(1_000);
      for (let j = 0; j < 5; j++) await flush();
    }
    expect({ phase: plane.currentPhase, admissionOpen: kind.admissionOpen }).toEqual({ phase: "idle", admissionOpen: true });
  });

  it("refuses a directory of another checkpoint", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    expect(await refused(call("restore", { checkpoint_id: "other", checkpoint_dir: dir, episode_ids: [] }))).toBe("invalid_checkpoint_state");
  });

  it("fences the scope's source attempts once installed (even without a record here), until forget; a failed install fences nothing", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 1 }]);
    const scope = [
      { rollout_id: "r1", attempt: 1 },
      { rollout_id: "r2", attempt: 0 },
    ];
    kind.failNext("install");
    await expect(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope })).rejects.toThrow(/install/);
    expect(plane.isRetired({ rollout_id: "r1", attempt: 1 })).toBe(false);
    await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope });
    const fenced = (rollout_id: string, attempt: number) => plane.isRetired({ rollout_id, attempt });
    expect([fenced("r1", 0), fenced("r1", 1), fenced("r1", 2), fenced("r2", 0), fenced("r2", 1), fenced("r3", 0)]).toEqual([true, true, false, true, false, false]);
    expect(() => plane.assertNotRetired({ rollout_id: "r2", attempt: 0 })).toThrow(/restored here as a later attempt/);
    expect(plane.status().retired_rollouts).toBe(0);
    await call("forget", { checkpoint_id: "src", rollout_ids: ["r1"] });
    expect([fenced("r1", 1), fenced("r2", 0)]).toEqual([false, true]);
  });

  it("re-exports restored episodes whose replacement has not started", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await call("resume", { checkpoint_id: "src" });
    await call("prepare", { checkpoint_id: "c2" });
    const reply = await call("commit", { checkpoint_id: "c2" });
    expect(reply.episode_ids).toEqual(["r1-a1"]);
  });
});


describe("control plane log lines", () => {
  it("carry instance once under a server logger that already binds it (pino writes a rebound key twice)", async () => {
    const lines: string[] = [];
    const logger = pino({ base: { instance: "env9" } }, { write: (line: string) => void lines.push(line) });
    const logged = new ParticipantControlPlane({ adapter: new ScriptableKind("environment"), instance: "env9", clock, leaseGraceSeconds: 60, checkpointRoot: root, logger });
    try {
      await logged.handle("commit", { checkpoint_id: "never-prepared", deadline_ts: DEADLINE, epoch: 1, checkpoint_dir: join(root, "x"), episode_ids: null, stop: false }).catch(() => undefined);
    } finally {
      logged.dispose();
    }
    expect(lines.length).toBeGreaterThan(0);
    for (const line of lines) expect(line.match(/"instance":/g), line).toHaveLength(1);
    expect(JSON.parse(lines[0]!)).toMatchObject({ instance: "env9", kind: "environment" });
  });
});

/** Real checkpoint storage whose reads (a slow shared filesystem: a large checkpoint's records) end only once `until` resolves. */
function slowStorage(until: Promise<unknown>): { storage: CheckpointStorage; reading: () => boolean } {
  const fs = new FsCheckpointStorage();
  let started = false;
  const storage: CheckpointStorage = {
    write: (...args) => fs.write(...args),
    async read(...args) {
      started = true;
      await until;
      return fs.read(...args);
    },
  };
  return { storage, reading: () => started };
}

/**
 * `plane` replaced by one whose storage reads slowly; a restore of r1 (deadline DEADLINE) started
 * and its records read under way, ending once `hold` is resolved.
 */
async function restoreReadingSlowly(): Promise<{ restore: ReturnType<typeof call<"restore">>; hold: { resolve: () => void } }> {
  const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
  const hold = deferred();
  const { storage, reading } = slowStorage(hold.promise);
  plane.dispose();
  plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, storage, leaseGraceSeconds: 60, checkpointRoot: root });
  const restore = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
  void restore.catch(() => undefined);
  await waitUntil(reading, "the read to start");
  return { restore, hold };
}

describe("restore whose records read outlives its deadline", () => {
  it("answers deadline_exceeded and installs nothing (the deadline is checked before any state change)", async () => {
    const { restore, hold } = await restoreReadingSlowly();
    clock.advance(31_000); // the restore's deadline passes while its records are read
    hold.resolve();
    const outcome = await restore.then(
      (reply) => `replied ${reply.phase}`,
      (error: unknown) => `refused ${(error as { code?: string }).code}`,
    );
    expect({ outcome, installed: [...kind.restored.keys()], phase: plane.currentPhase, admissionOpen: kind.admissionOpen }).toEqual({
      outcome: "refused deadline_exceeded",
      installed: [],
      phase: "idle",
      admissionOpen: true,
    });
  });
});

describe("restore whose records read outlives its deadline while live state appeared", () => {
  it("answers the refusal it would give in time (not fresh), not deadline_exceeded, which tells the coordinator attempt+1 may be installed here", async () => {
    const { restore, hold } = await restoreReadingSlowly();
    kind.addEpisode({ rollout_id: "live", attempt: 0 }); // a call admitted here while the records were read
    clock.advance(31_000); // and the restore's deadline passes before the read ends
    hold.resolve();
    const outcome = await restore.then(
      (reply) => `replied ${reply.phase}`,
      (error: unknown) => `refused ${(error as { code?: string }).code}`,
    );
    expect({ outcome, installed: [...kind.restored.keys()], phase: plane.currentPhase, admissionOpen: kind.admissionOpen, hooks: kind.hooks() }).toEqual({
      outcome: "refused invalid_checkpoint_state",
      installed: [],
      phase: "idle",
      admissionOpen: true,
      hooks: [],
    });
  });

  it("without live state stays deadline_exceeded, changes nothing, and the same restore sent again in time installs it", async () => {
    const { restore, hold } = await restoreReadingSlowly();
    clock.advance(31_000);
    hold.resolve();
    expect(await refused(restore)).toBe("deadline_exceeded");
    expect({ hooks: kind.hooks(), phase: plane.currentPhase, lease: plane.status().lease_expires_at }).toEqual({ hooks: [], phase: "idle", lease: null });
    // A successor re-driving it (same id, scope and directory, a new deadline) gets it installed now.
    const dir = join(root, "src");
    const again = await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, deadline_ts: T0 + 31 + 30, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect({ restored: again.restored, phase: plane.currentPhase }).toEqual({ restored: ["r1-a1"], phase: "restored" });
  });
});

describe("lease expiry whose reopen fails once (the kind's openAdmission throws)", () => {
  it("does not leave an unhandled rejection and still reopens at a later try", async () => {
    const unhandled: unknown[] = [];
    const onUnhandled = (reason: unknown) => unhandled.push(reason);
    process.prependListener("unhandledRejection", onUnhandled);
    try {
      await call("prepare", { checkpoint_id: "c1" });
      kind.failNext("openAdmission", new Error("transient reopen failure"));
      clock.advance(91_000); // past deadline + grace
      for (let i = 0; i < 10; i++) await flush();
      // Later on the participant should still get back to idle by itself (the lease is its only way out
      // when the coordinator is gone).
      for (let i = 0; i < 5 && plane.currentPhase !== "idle"; i++) {
        clock.advance(120_000);
        for (let j = 0; j < 10; j++) await flush();
      }
      expect({ phase: plane.currentPhase, admissionOpen: kind.admissionOpen, unhandled: unhandled.map(String) }).toEqual({
        phase: "idle",
        admissionOpen: true,
        unhandled: [],
      });
    } finally {
      process.removeListener("unhandledRejection", onUnhandled);
    }
  });
});

describe("restore whose records read outlives its deadline, on the system clock", () => {
  it("does not install and answer restored a second after its deadline", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const { storage } = slowStorage(new Promise((resolve) => setTimeout(resolve, 2_000)));
    const sysKind = new ScriptableKind("environment");
    const p = new ParticipantControlPlane({ adapter: sysKind, instance: "env0", storage, leaseGraceSeconds: 60, checkpointRoot: root });
    try {
      const deadline = Date.now() / 1000 + 1;
      const outcome = await p
        .handle("restore", { checkpoint_id: "src", deadline_ts: deadline, epoch: 1, checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] } as never)
        .then(
          (reply) => `replied ${(reply as { phase: string }).phase} ${(Date.now() / 1000 - deadline).toFixed(1)} s after its deadline`,
          (error: unknown) => `refused ${(error as { code?: string }).code}`,
        );
      expect({ outcome, installed: [...sysKind.restored.keys()] }).toEqual({ outcome: "refused deadline_exceeded", installed: [] });
    } finally {
      p.dispose();
    }
  }, 10_000);
});

describe("restore clean-up queued behind a restore whose read outlives both deadlines", () => {
  it("leaves nothing of the checkpoint installed after the coordinator's clean-up (retire attempt+1, resume)", async () => {
    const { restore, hold } = await restoreReadingSlowly();
    // The coordinator's request timed out (outcome unknown): its clean-up retires attempt+1 where the
    // restore may have installed it (deadline: 30 s from now), then resumes everyone.
    clock.advance(31_000);
    const retire = call("retire", { checkpoint_id: "src", deadline_ts: T0 + 61, episode_ids: [{ rollout_id: "r1", attempt: 1 }] });
    const resume = call("resume", { checkpoint_id: "src", deadline_ts: T0 + 61 });
    void retire.catch(() => undefined); // its own deadline passes while it waits behind the restore
    clock.advance(31_000); // the read ends only after that too
    hold.resolve();
    const restoreOutcome = await restore.then(
      () => "restored",
      (error: unknown) => (error as { code?: string }).code,
    );
    await resume;
    // The controller is told restore_failed and restarts r1 from input: nothing of the checkpoint
    // may be left installed, whether or not the queued retire still ran in time to fence r1-a1.
    expect({ restore: restoreOutcome, restoredPending: [...kind.restored.keys()], phase: plane.currentPhase }).toEqual({
      restore: "deadline_exceeded",
      restoredPending: [],
      phase: "idle",
    });
  });
});

describe("the free of a restore install that outlived its deadline, whose retire hook hangs", () => {
  it("does not hold the lock for good: a prepare after it goes ahead, and the free is tried again (not beside the hung one)", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const install = deferred();
    kind.delay("install", install.promise); // a provider that answers late
    const restore = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, deadline_ts: T0 + 10, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await waitUntil(() => kind.hooks().includes("install"), "the install to start");
    clock.advance(11_000);
    expect(await refused(restore)).toBe("deadline_exceeded");
    kind.delay("retire", new Promise<void>(() => undefined)); // the same provider, now not answering at all
    install.resolve(); // the late install ends: its free (a retire of r1-a1) runs under the lock and hangs
    await waitUntil(() => kind.hooks().includes("retire"), "the free to start");
    expect(kind.hooks().filter((h) => h === "retire")).toHaveLength(1);
    const prepare = call("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 300 });
    clock.advance(31_000); // the free's bound
    expect((await prepare).phase).toBe("prepared");
    // Not freed: tried again outside a checkpoint, never while the hung retire still runs.
    await call("resume", { checkpoint_id: "c1", deadline_ts: T0 + 300 });
    for (let i = 0; i < 5; i++) {
      clock.advance(1_000);
      await flush();
    }
    expect(kind.hooks().filter((h) => h === "retire")).toHaveLength(1);
  });
});

describe("the free of a restore install that outlived its deadline, whose retire hook hangs, with live state beside it", () => {
  // The test above ends with no live state (its free then gives up at once), so it never saw a free
  // tried again. Here another episode is live: the failed free is held and retried, "never started
  // again while an earlier one still runs", and started again once that one ended.
  it("is tried again after its bound, not beside the hung retire, and again once that retire ended", async () => {
    const install = await restoreOutlivingItsDeadline();
    const hung = deferred();
    kind.delay("retire", hung.promise);
    install.resolve();
    await waitUntil(() => kind.hooks().includes("retire"), "the free to start");
    kind.addEpisode({ rollout_id: "r2", attempt: 0 }); // live state meanwhile: the failed free is held, not dropped
    clock.advance(31_000); // the free's bound: held, retried every second while idle
    for (let i = 0; i < 5; i++) {
      clock.advance(1_000);
      await flush();
    }
    expect(kind.hooks().filter((h) => h === "retire")).toHaveLength(1); // never beside the hung one
    kind.delay("retire", Promise.resolve());
    hung.resolve();
    await flush();
    for (let i = 0; i < 5 && kind.hooks().filter((h) => h === "retire").length < 2; i++) {
      clock.advance(1_000);
      await flush();
    }
    expect(kind.hooks().filter((h) => h === "retire")).toHaveLength(2); // tried again once it ended
  });
});

describe("the free of a restore install that outlived its deadline, across a wall-clock step back", () => {
  it("is bounded by a duration: a step back of an hour does not hold the lock an hour longer", async () => {
    const install = await restoreOutlivingItsDeadline();
    kind.delay("retire", new Promise<void>(() => undefined)); // the free's retire hangs
    install.resolve();
    await waitUntil(() => kind.hooks().includes("retire"), "the free to start");
    clock.stepWall(-3_600_000); // NTP steps the wall clock an hour back while the free holds the lock
    const prepare = call("prepare", { checkpoint_id: "c1", deadline_ts: T0 - 3_000 });
    clock.advance(31_000); // the free's bound (30 s) passed
    const outcome = await Promise.race([
      prepare.then((reply) => reply.phase),
      (async () => {
        for (let i = 0; i < 50; i++) await flush();
        return "still queued behind the free";
      })(),
    ]);
    expect(outcome).toBe("prepared");
  });
});

/**
 * A restore of r1 whose install is still running (held until `resolve`) when its deadline passes:
 * refused `deadline_exceeded`. As the resources kind's install: the fence is checked first, then a
 * provider answers late, then the state is installed.
 */
async function restoreOutlivingItsDeadline(): Promise<ReturnType<typeof deferred>> {
  const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
  const install = deferred();
  let installing = false;
  kind.install = async (records) => {
    installing = true;
    await install.promise;
    for (const record of records) kind.restored.set(captureKey(nextAttempt(record.episode_id)), { episode_id: nextAttempt(record.episode_id), state: record.state });
  };
  const restore = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, deadline_ts: T0 + 10, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
  await waitUntil(() => installing, "the install to start");
  clock.advance(11_000);
  expect(await refused(restore)).toBe("deadline_exceeded");
  return install;
}

describe("the free of a restore install that outlived its deadline, ending while a new checkpoint is open", () => {
  it("waits until that checkpoint is resumed: the kind's retire never runs while it is open, and its commit is not held behind the free", async () => {
    const install = await restoreOutlivingItsDeadline();
    // A kind's retire waits for the stopped work's final clean-up, whose calls wait for resume (why
    // retire is refused while a checkpoint is open): scripted as waiting for admission to reopen.
    const reopened = deferred();
    const open = kind.openAdmission.bind(kind);
    kind.openAdmission = async () => {
      await open();
      reopened.resolve();
    };
    const retire = kind.retire.bind(kind);
    const retiredIn: string[] = [];
    kind.retire = async (episodes) => {
      retiredIn.push(plane.currentPhase);
      if (!kind.admissionOpen) await reopened.promise;
      await retire(episodes);
    };
    expect((await call("prepare", { checkpoint_id: "c2", deadline_ts: T0 + 300 })).phase).toBe("prepared");
    install.resolve(); // the late install ends while c2 is open
    for (let i = 0; i < 10; i++) await flush();
    let answered = false;
    const commit = call("commit", { checkpoint_id: "c2", deadline_ts: T0 + 300 }).finally(() => void (answered = true));
    const commitAnswered = await waitUntil(() => answered, "c2's commit", 20_000).then(
      () => true,
      () => false,
    );
    const during = { retiredIn: [...retiredIn], commitAnswered };
    clock.advance(31_000); // a free still running under the lock gives up at its bound: the test ends either way
    const committed = await commit.then(
      (reply) => reply.phase,
      (error: unknown) => refusalCode(Promise.reject(error)),
    );
    expect({ ...during, committed }).toEqual({ retiredIn: [], commitAnswered: true, committed: "committed" });
    // Once c2 is resumed the free runs, outside any checkpoint, and frees what the late install left.
    await call("resume", { checkpoint_id: "c2", deadline_ts: T0 + 400 });
    for (let i = 0; i < 5 && kind.restored.size > 0; i++) {
      clock.advance(1_000);
      for (let j = 0; j < 5; j++) await flush();
    }
    expect({ retiredIn, restored: [...kind.restored.keys()] }).toEqual({ retiredIn: ["idle"], restored: [] });
  });
});

describe("a later commit's export", () => {
  it("leaves out a restored attempt+1 retired meanwhile whose kind retire has not dropped it yet (a null scope), as the real kinds do", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await call("resume", { checkpoint_id: "src" });
    // The kind's retire outlives its deadline: r1-a1 is marked, its restored record still held.
    const gate = deferred();
    kind.delay("retire", gate.promise);
    const retire = call("retire", { checkpoint_id: "ret", deadline_ts: T0 + 10, episode_ids: [{ rollout_id: "r1", attempt: 1 }] });
    await waitUntil(() => kind.hooks().includes("retire"), "the kind's retire");
    clock.advance(11_000);
    expect(await refused(retire)).toBe("deadline_exceeded");
    expect([...kind.restored.keys()]).toEqual(["r1-a1"]);
    await call("prepare", { checkpoint_id: "c2", deadline_ts: T0 + 300 });
    const committed = await call("commit", { checkpoint_id: "c2", deadline_ts: T0 + 300 });
    expect(committed.episode_ids).toEqual([]);
    await call("resume", { checkpoint_id: "c2", deadline_ts: T0 + 300 });
    gate.resolve();
  });
});

// ---- phase-machine scenarios: the restored phase, leases, retries sharing work, crash leftovers ----

const snapshot = () => ({ status: plane.status(), admission: kind.admissionOpen, restored: [...kind.restored.keys()], live: [...kind.episodes.keys()] });

describe("restored phase", () => {
  it("refuses prepare, commit, restore of another id and ops naming another id, changing nothing", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    const before = snapshot();
    expect(await refused(call("prepare", { checkpoint_id: "src" }))).toBe("invalid_phase");
    expect(await refused(call("prepare", { checkpoint_id: "c2" }))).toBe("checkpoint_conflict");
    expect(await refused(call("commit", { checkpoint_id: "src" }))).toBe("invalid_phase");
    expect(await refused(call("restore", { checkpoint_id: "c2", checkpoint_dir: dir, episode_ids: [] }))).toBe("checkpoint_conflict");
    expect(await refused(call("renew", { checkpoint_id: "c2", deadline_ts: T0 + 500 }))).toBe("checkpoint_conflict");
    expect(await refused(call("resume", { checkpoint_id: "c2" }))).toBe("checkpoint_conflict");
    expect(await refused(call("retire", { checkpoint_id: "c2", deadline_ts: T0 + 500, episode_ids: [{ rollout_id: "r1", attempt: 1 }] }))).toBe("checkpoint_conflict");
    expect(await refused(call("forget", { checkpoint_id: "c2", deadline_ts: T0 + 500, rollout_ids: ["r1"] }))).toBe("checkpoint_conflict");
    expect(snapshot()).toEqual(before);
  });

  it("retire and forget naming the restored id renew its lease; the restore's reply is kept", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r2", attempt: 0 }]);
    const scope = [{ rollout_id: "r1", attempt: 0 }, { rollout_id: "r2", attempt: 0 }];
    const reply = await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope });
    expect(plane.status().lease_expires_at).toBe(DEADLINE + 60);
    expect(await call("retire", { checkpoint_id: "src", deadline_ts: T0 + 100, episode_ids: [{ rollout_id: "r1", attempt: 1 }] })).toEqual({ retired: ["r1-a1"] });
    expect(plane.status().lease_expires_at).toBe(T0 + 160);
    expect([...kind.restored.keys()]).toEqual(["r2-a1"]);
    expect(await call("forget", { checkpoint_id: "src", deadline_ts: T0 + 200, rollout_ids: ["r1"] })).toEqual({ forgotten: ["r1"] });
    expect(plane.status().lease_expires_at).toBe(T0 + 260);
    expect(await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope })).toEqual(reply);
    expect(plane.currentPhase).toBe("restored");
  });

  it("a retire or forget that fails while restored extends nothing: the lease stays as the restore set it, and still expires then", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    const lease = DEADLINE + 60;
    expect(plane.status().lease_expires_at).toBe(lease);
    kind.failNext("retire", new CheckpointError("internal_error", "scripted retire failure"));
    expect(await refused(call("retire", { checkpoint_id: "src", deadline_ts: T0 + 300, episode_ids: [{ rollout_id: "r1", attempt: 1 }] }))).toBe("internal_error");
    kind.failNext("forget", new CheckpointError("invalid_request", "scripted forget refusal"));
    expect(await refused(call("forget", { checkpoint_id: "src", deadline_ts: T0 + 300, rollout_ids: ["r1"] }))).toBe("invalid_request");
    expect(plane.status().lease_expires_at).toBe(lease);
    // The coordinator went silent after those failures: the lease it last set still ends the checkpoint.
    clock.advance((lease - T0) * 1000);
    for (let i = 0; i < 5 && plane.currentPhase !== "idle"; i++) await flush();
    expect(plane.currentPhase).toBe("idle");
  });

  it("a lease that expires while restored reopens and fences the id like a resume", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const scope = [{ rollout_id: "r1", attempt: 0 }];
    await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope });
    clock.advance(91_000);
    for (let i = 0; i < 5; i++) await flush();
    expect({ phase: plane.currentPhase, admission: kind.admissionOpen, lease: plane.status().lease_expires_at }).toEqual({ phase: "idle", admission: true, lease: null });
    expect(await refused(call("restore", { checkpoint_id: "src", deadline_ts: T0 + 200, checkpoint_dir: dir, episode_ids: scope }))).toBe("stale_checkpoint");
    expect(await refused(call("renew", { checkpoint_id: "src", deadline_ts: T0 + 200 }))).toBe("stale_checkpoint");
    expect(await call("resume", { checkpoint_id: "src", deadline_ts: T0 + 200 })).toEqual({ phase: "idle", idempotent: true });
  });
});

describe("lease expiry while prepared", () => {
  it("stops the commit's write: no manifest, commit answers stale_checkpoint, admission reopens", async () => {
    const fs = new FsCheckpointStorage();
    const hold = deferred();
    let writes = 0;
    const storage: CheckpointStorage = {
      async write(target, records, options) {
        writes += 1;
        await hold.promise;
        return fs.write(target, records, options);
      },
      read: (...args) => fs.read(...args),
    };
    plane.dispose();
    plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, storage, leaseGraceSeconds: 60, checkpointRoot: root });
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const commit = call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 80 });
    const outcome = refused(commit); // observed at once: its deadline passes before the write ends
    await waitUntil(() => writes === 1, "the write to start");
    clock.advance(141_000); // past T0 + 80 + 60
    for (let i = 0; i < 5; i++) await flush();
    expect(plane.currentPhase).toBe("idle");
    hold.resolve();
    expect(await outcome).toBe("deadline_exceeded"); // its deadline passed first; the write goes on
    await waitUntil(async () => (await readdir(join(root, "c1/gym/environment/env0")).catch(() => [])).every((f) => !f.startsWith(".records")), "the stopped write to clean up");
    for (let i = 0; i < 5; i++) await flush();
    expect(existsSync(join(root, "c1/gym/environment/env0/manifest.json"))).toBe(false);
    expect(kind.admissionOpen).toBe(true);
    expect(await refused(call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 200 }))).toBe("stale_checkpoint");
  });
});

describe("concurrent retries", () => {
  it("a commit retried while the first write runs awaits it; one with another scope meanwhile is a conflict", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const gate = deferred();
    kind.delay("exportRecords", gate.promise);
    const first = call("commit", { checkpoint_id: "c1" });
    await waitUntil(() => kind.hooks().includes("exportRecords"), "export");
    const second = call("commit", { checkpoint_id: "c1" });
    expect(await refused(call("commit", { checkpoint_id: "c1", episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("checkpoint_conflict");
    gate.resolve();
    const [a, b] = await Promise.all([first, second]);
    expect(b).toEqual(a);
    expect(kind.hooks().filter((h) => h === "exportRecords")).toHaveLength(1);
    expect(plane.currentPhase).toBe("committed");
  });

  it("a restore retried while the first installs gets the same reply and installs once", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const gate = deferred();
    kind.delay("install", gate.promise);
    const scope = [{ rollout_id: "r1", attempt: 0 }];
    const first = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope });
    await waitUntil(() => kind.hooks().includes("install"), "install");
    const second = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: scope });
    gate.resolve();
    const [a, b] = await Promise.all([first, second]);
    expect(b).toEqual(a);
    expect(kind.hooks().filter((h) => h === "install")).toHaveLength(1);
  });
});

describe("storage crash points", () => {
  it("a records file without a manifest (crash before the manifest) restores nothing", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    await unlink(join(dir, "gym/environment/env0/manifest.json"));
    expect(await refused(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("invalid_checkpoint_state");
    expect({ phase: plane.currentPhase, admission: kind.admissionOpen, restored: kind.restored.size }).toEqual({ phase: "idle", admission: true, restored: 0 });
  });

  it("temp files a crashed write left beside a published manifest do not disturb the restore", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const pdir = join(dir, "gym/environment/env0");
    await writeFile(join(pdir, ".records.jsonl.123.abcdef"), "partial");
    await writeFile(join(pdir, ".manifest.json.123.abcdef"), "{");
    const reply = await call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    expect(reply.restored).toEqual(["r1-a1"]);
  });

  it("a commit into a participant directory a crashed writer left records and temp files in publishes", async () => {
    const pdir = join(root, "c1/gym/environment/env0");
    const { mkdir } = await import("node:fs/promises");
    await mkdir(pdir, { recursive: true });
    await writeFile(join(pdir, ".records.jsonl.123.abcdef"), "partial");
    await writeFile(join(pdir, ".manifest.json.123.abcdef"), "{");
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" });
    const reply = await call("commit", { checkpoint_id: "c1" });
    expect(reply.manifest.record_count).toBe(1);
    expect((await readdir(pdir)).filter((f) => !f.startsWith("."))).toEqual(["manifest.json", reply.manifest.records_file].sort());
  });
});

describe("closeAdmission that outlives its op's deadline", () => {
  /** The refusal code `op` settled with after a few turns of the event loop, or "pending" (it holds the lock). */
  async function outcomeSoon(op: Promise<unknown>): Promise<string> {
    let outcome = "pending";
    op.then(
      () => (outcome = "ok"),
      (error: unknown) => (outcome = error instanceof CheckpointError ? error.code : String(error)),
    );
    for (let i = 0; i < 10 && outcome === "pending"; i++) await flush();
    return outcome;
  }

  /** A prepare "c1" whose closeAdmission outlived its deadline (answered deadline_exceeded); resolving the gate ends that close. */
  async function prepareOutlivedByItsClose() {
    const gate = deferred();
    kind.delay("closeAdmission", gate.promise);
    const prepare = call("prepare", { checkpoint_id: "c1", deadline_ts: T0 + 10 });
    await waitUntil(() => kind.hooks().includes("closeAdmission"), "prepare to close admission");
    clock.advance(10_000);
    expect(await outcomeSoon(prepare)).toBe("deadline_exceeded");
    return gate;
  }

  it("a prepare answers deadline_exceeded at its deadline, back to idle holding no id and no lease, and frees the lock; admission reopens once the close ends, never beside it", async () => {
    const gate = await prepareOutlivedByItsClose();
    expect(plane.status()).toMatchObject({ phase: "idle", checkpoint_id: null, lease_expires_at: null });
    // The lock is free: a forget goes ahead, and a resume of the id fences it as never prepared here.
    expect(await outcomeSoon(call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 100, rollout_ids: ["r1"] }))).toBe("ok");
    expect(await outcomeSoon(call("resume", { checkpoint_id: "c1" }))).toBe("ok");
    expect(kind.hooks()).toEqual(["closeAdmission", "forget"]); // no openAdmission while the close still runs
    gate.resolve();
    await waitUntil(() => kind.hooks().includes("openAdmission"), "admission to reopen after the late close");
    expect(kind.admissionOpen).toBe(true);
    expect(plane.currentPhase).toBe("idle");
  });

  it("a prepare arriving while a late close still runs closes after it (not beside it) and owns admission: the late close's reopen is skipped", async () => {
    const gate = await prepareOutlivedByItsClose();
    const second = call("prepare", { checkpoint_id: "c2", deadline_ts: T0 + 100 });
    for (let i = 0; i < 5; i++) await flush();
    expect(kind.hooks()).toEqual(["closeAdmission"]);
    gate.resolve();
    expect((await second).phase).toBe("prepared");
    for (let i = 0; i < 5; i++) await flush();
    expect(kind.hooks()).toEqual(["closeAdmission", "closeAdmission"]);
    expect(kind.admissionOpen).toBe(false);
    expect(plane.status()).toMatchObject({ phase: "prepared", checkpoint_id: "c2" });
  });

  it("a prepare whose deadline passes while it waits for a late close never closes: refused, and admission reopens once, when the late close ends", async () => {
    const gate = await prepareOutlivedByItsClose();
    const second = call("prepare", { checkpoint_id: "c2", deadline_ts: T0 + 20 });
    for (let i = 0; i < 5; i++) await flush();
    clock.advance(10_000);
    expect(await outcomeSoon(second)).toBe("deadline_exceeded");
    expect(plane.status()).toMatchObject({ phase: "idle", checkpoint_id: null, lease_expires_at: null });
    gate.resolve();
    await waitUntil(() => kind.hooks().includes("openAdmission"), "admission to reopen after the late close");
    for (let i = 0; i < 5; i++) await flush();
    expect(kind.hooks()).toEqual(["closeAdmission", "openAdmission"]);
    expect(kind.admissionOpen).toBe(true);
  });

  it("a restore answers deadline_exceeded at its deadline, installs nothing and frees the lock; admission reopens once the close ends", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const gate = deferred();
    kind.delay("closeAdmission", gate.promise);
    const restore = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }], deadline_ts: T0 + 10 });
    await waitUntil(() => kind.hooks().includes("closeAdmission"), "restore to close admission");
    clock.advance(10_000);
    expect(await outcomeSoon(restore)).toBe("deadline_exceeded");
    expect(plane.status()).toMatchObject({ phase: "idle", checkpoint_id: null });
    expect(await outcomeSoon(call("forget", { checkpoint_id: "forget", deadline_ts: T0 + 100, rollout_ids: ["r1"] }))).toBe("ok");
    expect(kind.hooks()).toEqual(["closeAdmission", "forget"]);
    gate.resolve();
    await waitUntil(() => kind.hooks().includes("openAdmission"), "admission to reopen after the late close");
    expect(kind.admissionOpen).toBe(true);
    expect(kind.restored.size).toBe(0);
    expect(plane.isRetired({ rollout_id: "r1", attempt: 0 })).toBe(false);
  });
});

describe("a lease expiry whose reopen failed, racing the coordinator's late ops", () => {
  it("fences the id at once: a late commit or renew is refused stale_checkpoint and cannot extend the lease or write; the next try reopens", async () => {
    kind.addEpisode({ rollout_id: "r1", attempt: 0 });
    await call("prepare", { checkpoint_id: "c1" }); // lease T0 + 90
    kind.failNext("openAdmission", new Error("transient reopen failure"));
    clock.advance(91_000);
    for (let i = 0; i < 10; i++) await flush();
    expect(kind.admissionOpen).toBe(false); // the reopen failed; retried in a second
    expect(await refusalCode(call("renew", { checkpoint_id: "c1", deadline_ts: T0 + 300 }))).toBe("stale_checkpoint");
    expect(await refusalCode(call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 300 }))).toBe("stale_checkpoint");
    expect(existsSync(join(root, "c1/gym/environment/env0/manifest.json"))).toBe(false);
    expect(kind.hooks()).not.toContain("exportRecords");
    clock.advance(1_000);
    for (let i = 0; i < 10; i++) await flush();
    expect({ phase: plane.currentPhase, open: kind.admissionOpen }).toEqual({ phase: "idle", open: true });
  });

  it("a coordinator resume after that failed reopen still reopens (it is not answered idempotent while admission stays closed)", async () => {
    await call("prepare", { checkpoint_id: "c1" });
    kind.failNext("openAdmission", new Error("transient reopen failure"));
    clock.advance(91_000);
    for (let i = 0; i < 10; i++) await flush();
    expect(await call("resume", { checkpoint_id: "c1" })).toEqual({ phase: "idle", idempotent: false });
    expect({ phase: plane.currentPhase, open: kind.admissionOpen }).toEqual({ phase: "idle", open: true });
  });

  it("a coordinator resume whose reopen fails can be retried: the retry reopens", async () => {
    await call("prepare", { checkpoint_id: "c1" });
    kind.failNext("openAdmission", new Error("transient reopen failure"));
    await expect(call("resume", { checkpoint_id: "c1" })).rejects.toThrow("transient reopen failure");
    expect(await call("resume", { checkpoint_id: "c1" })).toEqual({ phase: "idle", idempotent: false });
    expect({ phase: plane.currentPhase, open: kind.admissionOpen }).toEqual({ phase: "idle", open: true });
  });
});

describe("a restore retried with another manifest pin", () => {
  it("is a checkpoint_conflict, not the reply of the manifest the first one installed; the same pin (or none) gets the kept reply", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const sha = sha256Hex(await readFile(join(dir, "gym", "environment", "env0", "manifest.json")));
    const restore = (manifest_sha256?: string) =>
      call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }], ...(manifest_sha256 !== undefined && { manifest_sha256 }) });
    const first = await restore(sha);
    expect(await refusalCode(restore("f".repeat(64)))).toBe("checkpoint_conflict");
    expect(await restore(sha)).toEqual(first);
    expect(await restore()).toEqual(first);
    expect(plane.currentPhase).toBe("restored");
  });

  it("after a first restore without a pin (an older coordinator), a retry pinning another manifest than the one read is a checkpoint_conflict too", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const sha = sha256Hex(await readFile(join(dir, "gym", "environment", "env0", "manifest.json")));
    const restore = (manifest_sha256?: string) =>
      call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }], ...(manifest_sha256 !== undefined && { manifest_sha256 }) });
    const first = await restore();
    expect(await refusalCode(restore("f".repeat(64)))).toBe("checkpoint_conflict");
    expect(await restore(sha)).toEqual(first);
    expect(plane.currentPhase).toBe("restored");
  });
});

describe("a forget racing a restore install that outlived its deadline", () => {
  it("keeps attempt+1 fenced until the late install ended and was freed: a checkpoint opened meanwhile never exports what it left", async () => {
    const install = await restoreOutlivingItsDeadline();
    // The coordinator's clean-up retires attempt+1; the rollout then finishes for good and is forgotten,
    // while the late install still runs. The forget is answered either way (here: past its deadline).
    await call("retire", { checkpoint_id: "cleanup", deadline_ts: T0 + 300, episode_ids: [{ rollout_id: "r1", attempt: 1 }] });
    const forget = call("forget", { checkpoint_id: "fg", deadline_ts: T0 + 100, rollout_ids: ["r1"] }).then(
      () => "forgotten",
      (error: unknown) => refusalCode(Promise.reject(error)),
    );
    for (let i = 0; i < 5; i++) await flush();
    // A checkpoint opens; the late install ends while it is open (its free waits for resume).
    const prepared = call("prepare", { checkpoint_id: "c2", deadline_ts: T0 + 300 });
    clock.advance(90_000); // the forget's deadline, if it waits
    expect(await forget).toMatch(/forgotten|deadline_exceeded/);
    expect((await prepared).phase).toBe("prepared");
    install.resolve();
    for (let i = 0; i < 10; i++) await flush();
    const committed = await call("commit", { checkpoint_id: "c2", deadline_ts: T0 + 300 });
    // The failed restore's attempt+1 of a forgotten rollout is never exported: a restore of c2 would bring it back.
    expect(committed.episode_ids).toEqual([]);
    await call("resume", { checkpoint_id: "c2", deadline_ts: T0 + 400 });
  });
});

describe("a forget queued behind a restore whose install then outlives its deadline", () => {
  it("waits for that late install as one sent after it would: attempt+1 stays fenced until the install ended and was freed", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const install = deferred();
    kind.delay("install", install.promise);
    const restore = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, deadline_ts: T0 + 10, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await waitUntil(() => kind.hooks().includes("install"), "the install to start");
    // Sent while the restore still installs in time: it finds no late install yet and queues on the lock.
    let answered = false;
    const forget = call("forget", { checkpoint_id: "fg", deadline_ts: T0 + 100, rollout_ids: ["r1"] }).finally(() => void (answered = true));
    for (let i = 0; i < 5; i++) await flush();
    clock.advance(11_000);
    expect(await refusalCode(restore)).toBe("deadline_exceeded");
    for (let i = 0; i < 10; i++) await flush();
    // The install still runs and may yet install r1-a1: its fence must stay.
    expect(answered).toBe(false);
    expect(plane.isRetired({ rollout_id: "r1", attempt: 1 })).toBe(true);
    install.resolve();
    expect(await forget).toEqual({ forgotten: ["r1"] });
    expect(plane.isRetired({ rollout_id: "r1", attempt: 1 })).toBe(false);
    expect(kind.restored.size).toBe(0);
  });
});

describe("a forget waiting for a late restore install of its rollout", () => {
  it("goes ahead once the install ended and was freed: the marks are lifted, nothing is held", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const install = deferred();
    kind.delay("install", install.promise);
    const restore = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, deadline_ts: T0 + 10, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await waitUntil(() => kind.hooks().includes("install"), "the install to start");
    clock.advance(11_000);
    expect(await refusalCode(restore)).toBe("deadline_exceeded");
    // A forget of another rollout does not wait for it.
    expect(await call("forget", { checkpoint_id: "fg", deadline_ts: T0 + 100, rollout_ids: ["other"] })).toEqual({ forgotten: ["other"] });
    let answered = false;
    const forget = call("forget", { checkpoint_id: "fg", deadline_ts: T0 + 100, rollout_ids: ["r1"] }).finally(() => void (answered = true));
    for (let i = 0; i < 5; i++) await flush();
    expect(answered).toBe(false);
    expect(plane.isRetired({ rollout_id: "r1", attempt: 1 })).toBe(true);
    install.resolve();
    expect(await forget).toEqual({ forgotten: ["r1"] });
    expect(plane.isRetired({ rollout_id: "r1", attempt: 1 })).toBe(false);
    expect(kind.restored.size).toBe(0);
  });
});
