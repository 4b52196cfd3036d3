import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ManualClock, ParticipantControlPlane, ScriptableKind } from "../../../participants/index.js";
import { refusalCode } from "../../support/refusal.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";

const T0 = 1_700_000_000; // seconds; ManualClock starts here
const DEADLINE = T0 + 30;

let root: string;
let clock: ManualClock;
let plane: ParticipantControlPlane;

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-cp-pin-"));
  clock = new ManualClock(T0 * 1000);
  plane = new ParticipantControlPlane({ adapter: new ScriptableKind("environment"), instance: "env0", clock, checkpointRoot: root });
});

afterEach(async () => {
  plane.dispose();
  await rm(root, { recursive: true, force: true });
});

/** A checkpoint `src` committed by another process; returns its directory and this participant's manifest digest. */
async function committed(): Promise<{ dir: string; sha: string }> {
  const source = new ScriptableKind("environment");
  const writer = new ParticipantControlPlane({ adapter: source, instance: "env0", clock, checkpointRoot: root });
  source.addEpisode({ rollout_id: "r1", attempt: 0 });
  await writer.handle("prepare", { checkpoint_id: "src", deadline_ts: DEADLINE, epoch: 1 });
  createCheckpointDir(root, "src");
  const reply = await writer.handle("commit", { checkpoint_id: "src", deadline_ts: DEADLINE, epoch: 1, checkpoint_dir: join(root, "src"), episode_ids: null, stop: false });
  writer.dispose();
  return { dir: join(root, "src"), sha: reply.manifest_sha256 };
}

describe("a restore retried with another manifest pin", () => {
  it("is a checkpoint_conflict, not the reply of the manifest the first one installed; the same pin (or none) gets the kept reply", async () => {
    const { dir, sha } = await committed();
    const restore = (manifest_sha256?: string) =>
      plane.handle("restore", {
        checkpoint_id: "src",
        checkpoint_dir: dir,
        episode_ids: [{ rollout_id: "r1", attempt: 0 }],
        deadline_ts: DEADLINE,
        epoch: 1,
        ...(manifest_sha256 !== undefined && { manifest_sha256 }),
      });
    const first = await restore(sha);
    expect(await refusalCode(restore("f".repeat(64)))).toBe("checkpoint_conflict");
    expect(await restore(sha)).toEqual(first);
    expect(await restore()).toEqual(first);
    expect(plane.currentPhase).toBe("restored");
  });
});
