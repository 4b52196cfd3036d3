import { existsSync, lstatSync, readFileSync, symlinkSync, writeFileSync } from "node:fs";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { makeEngine, writers } from "./fake-participants.js";
import { toCheckpointError } from "../../../protocol/index.js";
import { refusalOf } from "../../support/refusal.js";

/**
 * The checkpoint directory staged during the prepare is removed before the commit (an operator's
 * cleanup, another tool's retention, the storage remounted). Participants refuse a commit whose
 * directory they do not see, so the coordinator looks again before the decision: gone, it is made
 * again (nothing was in it yet); taken by something not a directory, the commit is refused.
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-dir-removed-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

/** Prepares `id` and lets its staging finish (the directory made), then runs `meddle` on the directory's path. */
async function preparedThen(made: ReturnType<typeof makeEngine>, id: string, meddle: (dir: string) => void | Promise<void>): Promise<void> {
  await made.engine.prepare({ checkpoint_id: id });
  await made.writer.settled();
  expect(lstatSync(join(root, id)).isDirectory()).toBe(true);
  await meddle(join(root, id));
}

describe("the checkpoint directory removed between prepare and commit", () => {
  it("commit op: the directory is made again before the commits, which land in it", async () => {
    const made = makeEngine(root);
    await preparedThen(made, "c1", (dir) => rm(dir, { recursive: true }));
    await made.engine.commit({ checkpoint_id: "c1", episode_ids: null, stop: false });
    expect(made.fake.commitSawDir).toEqual(Array(made.fake.members.length).fill(true));
    expect(made.journal.entries.get("c1")?.state).toBe("decided");
  });

  it("checkpoint op: removed after the staging, the checkpoint is still published into the directory made again", async () => {
    const made = makeEngine(root);
    const request = made.fake.request.bind(made.fake);
    let removed = false;
    made.fake.request = async (subject, body, options) => {
      if (!removed && subject.endsWith(".prepare")) {
        removed = true;
        await made.writer.settled(); // staged: the directory is there
        await rm(join(root, "c2"), { recursive: true });
      }
      return request(subject, body, options);
    };
    const reply = await made.engine.checkpoint({ checkpoint_id: "c2", episode_ids: null, stop: false, controller_state: null });
    expect(removed).toBe(true);
    expect(made.fake.commitSawDir).toEqual(Array(made.fake.members.length).fill(true));
    expect(reply.checkpoint_id).toBe("c2");
    expect(await made.catalog.latest()).toBe("c2");
    const manifest = JSON.parse(readFileSync(join(root, "c2", "checkpoint.json"), "utf8")) as { participants: { manifest_path: string }[] };
    for (const p of manifest.participants) expect(existsSync(join(root, "c2", p.manifest_path))).toBe(true);
  });

  it.each([
    ["a regular file", (dir: string) => writeFileSync(dir, "someone else's\n")],
    [
      "a symbolic link to a directory",
      async (dir: string) => {
        await mkdir(join(root, "elsewhere"));
        symlinkSync(join(root, "elsewhere"), dir);
      },
    ],
  ])("replaced by %s: refused with checkpoint_conflict before the decision, nothing else changed", async (_what, replace) => {
    const made = makeEngine(root);
    await preparedThen(made, "c3", async (dir) => {
      await rm(dir, { recursive: true });
      await replace(dir);
    });
    const before = lstatSync(join(root, "c3"));
    const refusal = await refusalOf(made.engine.commit({ checkpoint_id: "c3", episode_ids: null, stop: false }));
    expect(refusal.code).toBe("checkpoint_conflict");
    expect({ commits: made.fake.ops("commit").length, entry: made.journal.entries.get("c3")?.state, phase: made.engine.openCheckpoint?.phase }).toEqual({
      commits: 0,
      entry: "open",
      phase: "prepared",
    });
    const after = lstatSync(join(root, "c3"));
    expect({ ino: after.ino, mode: after.mode, size: after.size }).toEqual({ ino: before.ino, mode: before.mode, size: before.size });
    if (existsSync(join(root, "elsewhere"))) expect(existsSync(join(root, "elsewhere", "gym"))).toBe(false);
  });

  it("removed after the decision (a commit retried after one failed): refused, not made again, no commit sent", async () => {
    const made = makeEngine(root);
    const [first] = made.fake.members;
    made.fake.set(first!.kind, first!.instance, "commit", { error: "storage_error" });
    await made.engine.prepare({ checkpoint_id: "c5" });
    await made.writer.settled();
    // The others wrote into the directory; its removal takes their files with it.
    expect((await refusalOf(made.engine.commit({ checkpoint_id: "c5", episode_ids: null, stop: false }))).code).toBe("storage_error");
    const sent = made.fake.ops("commit").length;
    await rm(join(root, "c5"), { recursive: true });
    made.fake.set(first!.kind, first!.instance, "commit", "ok");
    const error = await made.engine.commit({ checkpoint_id: "c5", episode_ids: null, stop: false }).then(() => undefined, (e: unknown) => e);
    expect(toCheckpointError(error).code).toBe("storage_error");
    expect(toCheckpointError(error).message).toMatch(/removed after its commit was decided/);
    expect({ dir: existsSync(join(root, "c5")), commits: made.fake.ops("commit").length, entry: made.journal.entries.get("c5")?.state }).toEqual({
      dir: false,
      commits: sent,
      entry: "decided",
    });
  });

  it("removed after every commit answered: a retried publish does not make it again, nor names the files that are gone", async () => {
    const made = makeEngine(root);
    await made.engine.prepare({ checkpoint_id: "c6" });
    await made.engine.commit({ checkpoint_id: "c6", episode_ids: null, stop: false });
    await made.writer.settled();
    await rm(join(root, "c6"), { recursive: true }); // the participants' committed files with it
    // The first publication fails writing checkpoint.json (ENOENT); its retry staged afresh made the directory again.
    await made.engine.publish({ checkpoint_id: "c6", controller_state: null }).catch(() => undefined);
    const error = await made.engine.publish({ checkpoint_id: "c6", controller_state: null }).then(() => undefined, (e: unknown) => e);
    expect(toCheckpointError(error).code).toBe("storage_error");
    expect({ dir: existsSync(join(root, "c6")), latest: await made.catalog.latest() }).toEqual({ dir: false, latest: null });
  });

  it("the root already gone before the prepare (the storage unmounted, its mount point left): storage_error, neither the root nor its parents made on this host, nothing committed or published", async () => {
    const mountPoint = join(root, "mnt");
    const unmounted = join(mountPoint, "ckpt");
    const made = makeEngine(unmounted);
    const error = await made.engine.checkpoint({ checkpoint_id: "c7", episode_ids: null, stop: false, controller_state: null }).then(() => undefined, (e: unknown) => e);
    expect(toCheckpointError(error).code).toBe("storage_error");
    expect({ mountPoint: existsSync(mountPoint), root: existsSync(unmounted), commits: made.fake.ops("commit").length, open: made.engine.openCheckpoint }).toEqual({
      mountPoint: false,
      root: false,
      commits: 0,
      open: null,
    });
  });

  it("the whole root gone (the storage unmounted): storage_error, the root not made again on this host", async () => {
    const made = makeEngine(root);
    await preparedThen(made, "c4", () => rm(root, { recursive: true }));
    // Thrown as the file system's error; the API answers it as toCheckpointError maps it.
    const error = await made.engine.commit({ checkpoint_id: "c4", episode_ids: null, stop: false }).then(() => undefined, (e: unknown) => e);
    expect(toCheckpointError(error).code).toBe("storage_error");
    expect({ root: existsSync(root), commits: made.fake.ops("commit").length, entry: made.journal.entries.get("c4")?.state, phase: made.engine.openCheckpoint?.phase }).toEqual({
      root: false,
      commits: 0,
      entry: "open",
      phase: "prepared",
    });
  });
});
