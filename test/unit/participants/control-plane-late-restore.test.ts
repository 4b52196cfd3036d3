import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { type PhaseOp, type RequestInputOf } from "../../../protocol/index.js";
import { FsCheckpointStorage, ManualClock, ParticipantControlPlane, ScriptableKind, type CheckpointStorage } from "../../../participants/index.js";
import { waitUntil } from "../../support/wait-until.js";

const T0 = 1_700_000_000;
const DEADLINE = T0 + 30;

let root: string;
let clock: ManualClock;
let kind: ScriptableKind;
let plane: ParticipantControlPlane;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-races-"));
  clock = new ManualClock(T0 * 1000);
  kind = new ScriptableKind("environment");
  plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, leaseGraceSeconds: 60, checkpointRoot: root });
});
afterEach(async () => {
  plane.dispose();
  await rm(root, { recursive: true, force: true });
});

function call<O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }, p = plane) {
  const request = { deadline_ts: DEADLINE, epoch: 1, ...body };
  if (op === "commit") Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), episode_ids: null, stop: false, ...body });
  return p.handle(op, request as never);
}
const flush = () => new Promise((resolve) => setImmediate(resolve));
function deferred() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

async function checkpointWith(episodes: { rollout_id: string; attempt: number }[]): Promise<string> {
  const source = new ScriptableKind("environment");
  const writer = new ParticipantControlPlane({ adapter: source, instance: "env0", clock, checkpointRoot: root });
  for (const e of episodes) source.addEpisode(e, { at: e.rollout_id });
  await writer.handle("prepare", { checkpoint_id: "src", deadline_ts: DEADLINE, epoch: 1 });
  await writer.handle("commit", { checkpoint_id: "src", deadline_ts: DEADLINE, epoch: 1, checkpoint_dir: join(root, "src"), episode_ids: null, stop: false });
  writer.dispose();
  return join(root, "src");
}

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

describe("restore whose records read outlives its deadline", () => {
  it("answers deadline_exceeded and installs nothing (the deadline is checked before any state change)", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const hold = deferred();
    const { storage, reading } = slowStorage(hold.promise);
    plane.dispose();
    plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, storage, leaseGraceSeconds: 60, checkpointRoot: root });
    const restore = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    void restore.catch(() => undefined);
    await waitUntil(reading, "the read to start");
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
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const hold = deferred();
    const { storage, reading } = slowStorage(hold.promise);
    plane.dispose();
    plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, storage, leaseGraceSeconds: 60, checkpointRoot: root });
    const restore = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    void restore.catch(() => undefined);
    await waitUntil(reading, "the read to start");
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
