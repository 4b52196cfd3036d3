import { mkdtemp, readFile, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import type { PhaseOp, RequestInputOf } from "../../../protocol/index.js";
import { ManualClock } from "../../../participants/control-plane/clock.js";
import { ParticipantControlPlane } from "../../../participants/control-plane/control-plane.js";
import type { CheckpointStorage } from "../../../participants/storage/checkpoint-storage.js";
import { FsCheckpointStorage } from "../../../participants/storage/fs-storage.js";
import { ScriptableKind } from "../../../participants/testing/scriptable-kind.js";
import { createCheckpointDir } from "../../support/checkpoint-dir.js";

/**
 * Export once per checkpoint covers the manifest's `extra` too: a write that published its manifest
 * and then failed (the directory fsync after the link: EIO) is retried with the same records, and
 * must write the same manifest. Asked of the adapter again, an extra that changed since (a counter,
 * a time) made the retry's manifest differ from the published one: checkpoint_conflict at every
 * retry, and the checkpoint could never complete although its files were all there.
 */

const T0 = 1_700_000_000;
let root: string;
let plane: ParticipantControlPlane;

/** A custom kind whose manifest extra differs at each call (e.g. it names when it was asked). */
class StampingKind extends ScriptableKind {
  asked = 0;
  manifestExtra(): Record<string, unknown> {
    this.asked += 1;
    return { asked: this.asked };
  }
}

beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-extra-"));
});

afterEach(async () => {
  plane.dispose();
  await rm(root, { recursive: true, force: true });
});

it("a commit retried after its write published the manifest and then failed writes the same manifest extra, and commits", async () => {
  const kind = new StampingKind("environment");
  const fs = new FsCheckpointStorage();
  let failAfterPublish = true;
  const storage: CheckpointStorage = {
    async write(target, records, options) {
      const written = await fs.write(target, records, options);
      if (failAfterPublish) {
        failAfterPublish = false;
        throw Object.assign(new Error("EIO: i/o error, fsync"), { code: "EIO", syscall: "fsync" });
      }
      return written;
    },
    read: (...args) => fs.read(...args),
  };
  plane = new ParticipantControlPlane({ adapter: kind, instance: "env0", clock: new ManualClock(T0 * 1000), storage, checkpointRoot: root });
  const call = <O extends PhaseOp>(op: O, body: Partial<RequestInputOf<O>> & { checkpoint_id: string }) => {
    const request = { deadline_ts: T0 + 30, epoch: 1, ...body };
    if (op === "commit") Object.assign(request, { checkpoint_dir: join(root, body.checkpoint_id), episode_ids: null, stop: false });
    return plane.handle(op, request as never);
  };
  createCheckpointDir(root, "c1");
  kind.addEpisode({ rollout_id: "r1", attempt: 0 });
  await call("prepare", { checkpoint_id: "c1" });
  await expect(call("commit", { checkpoint_id: "c1" })).rejects.toThrow(/EIO/);
  const reply = await call("commit", { checkpoint_id: "c1" });
  expect(reply.phase).toBe("committed");
  expect(reply.manifest.extra).toEqual({ asked: 1 });
  const onDisk = JSON.parse(await readFile(join(root, "c1/gym/environment/env0/manifest.json"), "utf8")) as { extra: unknown };
  expect(onDisk.extra).toEqual({ asked: 1 });
});
