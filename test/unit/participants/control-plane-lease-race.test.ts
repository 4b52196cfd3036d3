import { mkdtemp, rm } from "node:fs/promises";
import { existsSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import type { PhaseOp, RequestInputOf } from "../../../protocol/index.js";
import { ManualClock, ParticipantControlPlane, ScriptableKind } from "../../../participants/index.js";
import { refusalCode } from "../../support/refusal.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";

const T0 = 1_700_000_000; // seconds; ManualClock starts here
const DEADLINE = T0 + 30;

let root: string;
let clock: ManualClock;
let kind: ScriptableKind;
let plane: ParticipantControlPlane;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-cp-race-"));
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

/** Lets promise chains started by timers run. */
const flush = () => new Promise((resolve) => setImmediate(resolve));

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
