import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { CheckpointError, captureKey, nextAttempt, type PhaseOp, type RequestInputOf } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";
import { deferred } from "../../support/deferred.js";
import { refusalCode } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * dispose() is the process shutting down: nothing the control plane left scheduled may stay armed
 * or fire into the kind afterwards. A reopen of admission that failed after a restore, and the free
 * of a restore install that outlived its deadline, are tried again a second later (LEASE_RETRY_MS):
 * dispose cancels those retries, and a late install that ends after dispose is not freed through
 * the kind's retire (its state goes with the process, as live state does).
 */

const T0 = 1_700_000_000;
let root: string;
let clock: ManualClock;
let kind: ScriptableKind;
let plane: ParticipantControlPlane;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-retry-dispose-"));
  clock = new ManualClock(T0 * 1000);
  kind = new ScriptableKind("environment");
  plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, leaseGraceSeconds: 60, checkpointRoot: root });
});

afterEach(async () => {
  plane.dispose();
  await rm(root, { recursive: true, force: true });
});

const flush = async () => {
  for (let i = 0; i < 10; i++) await new Promise((resolve) => setImmediate(resolve));
};

function call<O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) {
  return plane.handle(op, { deadline_ts: T0 + 30, epoch: 1, ...body } as never);
}

/** A checkpoint "src" of r1-a0, written by another participant of the same instance. */
async function checkpointOfR1(): Promise<string> {
  const source = new ScriptableKind("environment");
  const writer = new ParticipantControlPlane({ adapter: source, instance: "env0", clock, checkpointRoot: root });
  source.addEpisode({ rollout_id: "r1", attempt: 0 });
  await writer.handle("prepare", { checkpoint_id: "src", deadline_ts: T0 + 30, epoch: 1 });
  createCheckpointDir(root, "src");
  await writer.handle("commit", { checkpoint_id: "src", deadline_ts: T0 + 30, epoch: 1, checkpoint_dir: join(root, "src"), episode_ids: null, stop: false });
  writer.dispose();
  return join(root, "src");
}

/** A restore of r1 whose install is held until `resolve`, refused deadline_exceeded meanwhile. */
async function restoreOutlivingItsDeadline(): Promise<ReturnType<typeof deferred>> {
  const dir = await checkpointOfR1();
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
  expect(await refusalCode(restore)).toBe("deadline_exceeded");
  return install;
}

it("a failed restore's reopen retry is cancelled by dispose: no timer left, and no openAdmission into the stopped participant", async () => {
  const dir = await checkpointOfR1();
  kind.failNext("install", new CheckpointError("invalid_checkpoint_state", "scripted: a record does not validate"));
  kind.failNext("openAdmission", new Error("transient reopen failure"));
  expect(await refusalCode(call("restore", { checkpoint_id: "src", checkpoint_dir: dir, episode_ids: [{ rollout_id: "r1", attempt: 0 }] }))).toBe("invalid_checkpoint_state");
  expect(clock.pendingTimers).toBe(1); // the reopen's retry
  plane.dispose();
  expect(clock.pendingTimers).toBe(0);
  const hooks = kind.hooks().length;
  clock.advance(5_000);
  await flush();
  expect(kind.hooks().slice(hooks)).toEqual([]);
});

it("the retry of a late install's failed free is cancelled by dispose, and arms nothing after it", async () => {
  const install = await restoreOutlivingItsDeadline();
  kind.addEpisode({ rollout_id: "r2", attempt: 0 }); // live state: a failed free is held and retried
  kind.failNext("retire", new Error("provider refused the delete"));
  install.resolve();
  await waitUntil(() => kind.hooks().includes("retire") && clock.pendingTimers === 1, "the free to fail and its retry to be armed");
  plane.dispose();
  expect(clock.pendingTimers).toBe(0);
  clock.advance(5_000);
  await flush();
  expect({ timers: clock.pendingTimers, retires: kind.hooks().filter((h) => h === "retire").length }).toEqual({ timers: 0, retires: 1 });
});

it("a late install that ends after dispose is not freed through the kind, and leaves no timer", async () => {
  const install = await restoreOutlivingItsDeadline();
  plane.dispose();
  install.resolve();
  await flush();
  clock.advance(5_000);
  await flush();
  expect({ timers: clock.pendingTimers, hooks: kind.hooks().filter((h) => h === "retire") }).toEqual({ timers: 0, hooks: [] });
});
