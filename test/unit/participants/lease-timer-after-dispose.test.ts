import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import type { PhaseOp, RequestInputOf } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import type { CheckpointStorage } from "../../../participants/storage/checkpoint-storage.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";
import { deferred } from "../../support/deferred.js";
import { refusalCode } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * dispose() is the process shutting down: nothing it leaves behind may fire into the kind later.
 * A commit whose write outlived its deadline (answered deadline_exceeded, so the endpoint's stop
 * no longer waits for it) and fails after dispose puts back the lease it had; that must not arm
 * the lease timer again, whose expiry would reopen admission (openAdmission) on a stopped server.
 */

const T0 = 1_700_000_000;
let root: string;
let clock: ManualClock;
let kind: ScriptableKind;
let plane: ParticipantControlPlane;
const write = deferred();
let writes = 0;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-dispose-"));
  clock = new ManualClock(T0 * 1000);
  kind = new ScriptableKind("environment");
  const storage: CheckpointStorage = {
    async write() {
      writes += 1;
      await write.promise;
      throw Object.assign(new Error("EIO: i/o error, write"), { code: "EIO", syscall: "write" });
    },
    read: () => Promise.reject(new Error("not read here")),
  };
  plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock, storage, leaseGraceSeconds: 60, checkpointRoot: root });
});

afterEach(async () => {
  plane.dispose();
  await rm(root, { recursive: true, force: true });
});

function call<O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) {
  const request = { deadline_ts: T0 + 30, epoch: 1, ...body };
  if (op === "commit") {
    createCheckpointDir(root, body.checkpoint_id);
    Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), episode_ids: null, stop: false, ...body });
  }
  return plane.handle(op, request as never);
}

it("a commit write failing after dispose arms no lease timer: the lease's expiry never reopens admission on the stopped participant", async () => {
  kind.addEpisode({ rollout_id: "r1", attempt: 0 });
  await call("prepare", { checkpoint_id: "c1" }); // lease T0 + 90
  const commit = refusalCode(call("commit", { checkpoint_id: "c1", deadline_ts: T0 + 10 }));
  await waitUntil(() => writes === 1, "the write to start");
  clock.advance(10_000);
  expect(await commit).toBe("deadline_exceeded"); // the write runs on
  plane.dispose();
  expect(clock.pendingTimers).toBe(0);
  write.resolve(); // it fails now, putting back the lease it had
  for (let i = 0; i < 10; i++) await new Promise((resolve) => setImmediate(resolve));
  expect(clock.pendingTimers).toBe(0);
  clock.advance(600_000);
  for (let i = 0; i < 10; i++) await new Promise((resolve) => setImmediate(resolve));
  expect(kind.hooks()).not.toContain("openAdmission");
});
