import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { captureKey, nextAttempt, type PhaseOp, type RequestInputOf } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { refusalCode } from "../../support/refusal.js";
import { waitUntil } from "../../support/wait-until.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";

const T0 = 1_700_000_000;
const DEADLINE = T0 + 30;

let root: string;
let clock: ManualClock;
let kind: ScriptableKind;
let plane: ParticipantControlPlane;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-cp-late-forget-"));
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

function deferred() {
  let resolve!: () => void;
  const promise = new Promise<void>((r) => (resolve = r));
  return { promise, resolve };
}

const flush = () => new Promise((resolve) => setImmediate(resolve));

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

describe("a forget racing a restore install that outlived its deadline", () => {
  it("keeps attempt+1 fenced until the late install ended and was freed: a checkpoint opened meanwhile never exports what it left", async () => {
    const dir = await checkpointWith([{ rollout_id: "r1", attempt: 0 }]);
    const install = deferred();
    let installing = false;
    // As the resources kind's: the fence is checked first, then a provider answers late, then the state is installed.
    kind.install = async (records) => {
      installing = true;
      await install.promise;
      for (const record of records) kind.restored.set(captureKey(nextAttempt(record.episode_id)), { episode_id: nextAttempt(record.episode_id), state: record.state });
    };
    const restore = call("restore", { checkpoint_id: "src", checkpoint_dir: dir, deadline_ts: T0 + 10, episode_ids: [{ rollout_id: "r1", attempt: 0 }] });
    await waitUntil(() => installing, "the install to start");
    clock.advance(11_000);
    expect(await refusalCode(restore)).toBe("deadline_exceeded");
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
