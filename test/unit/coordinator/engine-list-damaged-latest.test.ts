import { mkdir, mkdtemp, readdir, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CtlGetReplySchema, CtlListReplySchema, ROOT_DEPLOYMENT_FILE, toCheckpointError } from "../../../protocol/index.js";
import { makeEngine, writers } from "./fake-participants.js";

/**
 * `list` when LATEST is damaged: that is when an operator or a controller lists the published
 * checkpoints, to pick an older one to restore (docs/operations.md), so the listing is answered,
 * `latest` null and `latest_error` saying why, as `gym-ckpt ls --json` does; never refused whole.
 */
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-list-latest-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const R1 = [{ rollout_id: "r1", attempt: 0 }];

async function publishedTwo() {
  const made = makeEngine(root);
  for (const id of ["c1", "c2"]) await made.engine.checkpoint({ checkpoint_id: id, episode_ids: R1, stop: false, controller_state: null });
  return made;
}

describe("list with a damaged LATEST", () => {
  it("a LATEST holding garbage: the checkpoints are listed, latest null, latest_error invalid_checkpoint_state", async () => {
    const { engine } = await publishedTwo();
    await writeFile(join(root, "LATEST"), "not a checkpoint id!\n");
    const reply = CtlListReplySchema.parse(await engine.list()); // the strict reply schema takes it
    expect(reply.latest).toBeNull();
    expect(reply.latest_error).toEqual({ code: "invalid_checkpoint_state", detail: "LATEST does not name a checkpoint id" });
    expect(reply.checkpoints.map((c) => c.checkpoint_id)).toEqual(["c2", "c1"]);
  });

  it("a LATEST that is a directory: listed, latest_error invalid_checkpoint_state", async () => {
    const { engine } = await publishedTwo();
    await rm(join(root, "LATEST"));
    await mkdir(join(root, "LATEST"));
    const reply = CtlListReplySchema.parse(await engine.list());
    expect(reply.latest).toBeNull();
    expect(reply.latest_error?.code).toBe("invalid_checkpoint_state");
    expect(reply.checkpoints.map((c) => c.checkpoint_id)).toEqual(["c2", "c1"]);
  });

  it("a LATEST naming a checkpoint whose checkpoint.json is damaged: not named as latest, latest_error says why", async () => {
    const { engine } = await publishedTwo();
    await writeFile(join(root, "c2", "checkpoint.json"), '{"schema_version":');
    const reply = CtlListReplySchema.parse(await engine.list());
    expect(reply.checkpoints.map((c) => c.checkpoint_id)).toEqual(["c1"]);
    expect(reply.latest).toBeNull();
    expect(reply.latest_error?.code).toBe("invalid_checkpoint_state");
  });

  it("a LATEST naming a checkpoint that is gone: latest null, latest_error not_found", async () => {
    const { engine } = await publishedTwo();
    await rm(join(root, "c2"), { recursive: true });
    const reply = CtlListReplySchema.parse(await engine.list());
    expect(reply.checkpoints.map((c) => c.checkpoint_id)).toEqual(["c1"]);
    expect(reply.latest).toBeNull();
    expect(reply.latest_error?.code).toBe("not_found");
  });

  it("a sound LATEST: no latest_error key at all", async () => {
    const { engine } = await publishedTwo();
    const reply = await engine.list();
    expect(reply).toEqual({ latest: "c2", checkpoints: expect.any(Array) });
    expect("latest_error" in reply).toBe(false);
  });
});

/**
 * `get` of the older checkpoint the listing offers: how a controller reads its scope before it
 * restores it (docs/api.md, `get`). A damaged LATEST refused it (invalid_checkpoint_state naming
 * LATEST), so the listing's way out led nowhere.
 */
describe("get with a damaged LATEST", () => {
  it("answers the checkpoint asked for, not named latest", async () => {
    const { engine } = await publishedTwo();
    await writeFile(join(root, "LATEST"), "not a checkpoint id!\n");
    const reply = CtlGetReplySchema.parse(await engine.get({ checkpoint_id: "c1" }));
    expect(reply.latest).toBe(false);
    expect(reply.manifest).toMatchObject({ checkpoint_id: "c1", scope: R1 });
  });

  it("a LATEST that is a directory: answered alike", async () => {
    const { engine } = await publishedTwo();
    await rm(join(root, "LATEST"));
    await mkdir(join(root, "LATEST"));
    expect(await engine.get({ checkpoint_id: "c2" })).toMatchObject({ latest: false, manifest: { checkpoint_id: "c2" } });
  });

  it("a damaged checkpoint.json of the one asked for is still refused", async () => {
    const { engine } = await publishedTwo();
    await writeFile(join(root, "LATEST"), "not a checkpoint id!\n");
    await writeFile(join(root, "c1", "checkpoint.json"), '{"schema_version":');
    await expect(engine.get({ checkpoint_id: "c1" })).rejects.toMatchObject({ code: "invalid_checkpoint_state", message: expect.stringContaining("c1") });
  });
});

/**
 * The root gone while the coordinator runs (made at its start: a shared filesystem unmounted, its
 * parent mount point left empty) is no root where nothing was published: `list` answered
 * `{latest: null, checkpoints: []}`, which a controller takes for a fresh start (`collect` then
 * starts every logged rollout over from input, past the checkpoints the storage still holds).
 */
describe("list with the checkpoint root gone", () => {
  it("is storage_error naming the root, not an empty listing", async () => {
    const { engine } = await publishedTwo();
    await rm(root, { recursive: true, force: true });
    const refusal = await engine.list().then(
      (reply) => reply,
      (error: unknown) => toCheckpointError(error),
    );
    expect(refusal).toMatchObject({ code: "storage_error", message: expect.stringContaining(root) });
  });

  it("a restore of LATEST is storage_error too, not not_found 'nothing was published yet'", async () => {
    const { engine } = await publishedTwo();
    await rm(root, { recursive: true, force: true });
    const refusal = await engine.restore({ episode_ids: R1 }).then(
      (reply) => reply,
      (error: unknown) => toCheckpointError(error),
    );
    expect(refusal).toMatchObject({ code: "storage_error", message: expect.stringContaining(root) });
  });
});

/**
 * The root that is itself the mount point: unmounted, it is an empty directory, not gone. The
 * daemon claimed it at its start (ROOT_DEPLOYMENT_FILE), so a root without that file is not the one
 * it checkpoints into: never "nothing published", and nothing is published onto the local disk
 * under the mount point (participants on this host would commit there, hidden once it is back).
 */
describe("a claimed root that lost its claim file (an empty mount point)", () => {
  async function unmounted() {
    await writeFile(join(root, ROOT_DEPLOYMENT_FILE), '{"deployment":"d"}\n');
    const made = makeEngine(root, { claim: ROOT_DEPLOYMENT_FILE });
    for (const id of ["c1", "c2"]) await made.engine.checkpoint({ checkpoint_id: id, episode_ids: R1, stop: false, controller_state: null });
    await Promise.all(writers.map((w) => w.settled()));
    for (const name of await readdir(root)) await rm(join(root, name), { recursive: true, force: true });
    return made;
  }

  it("list and a restore of LATEST are storage_error naming the missing file", async () => {
    const { engine } = await unmounted();
    for (const op of [() => engine.list(), () => engine.restore({ episode_ids: R1 })]) {
      const refusal = await op().then(
        (reply) => reply,
        (error: unknown) => toCheckpointError(error),
      );
      expect(refusal).toMatchObject({ code: "storage_error", message: expect.stringContaining(ROOT_DEPLOYMENT_FILE) });
    }
  });

  it("a checkpoint is refused storage_error and writes nothing under the root", async () => {
    const { engine } = await unmounted();
    const refusal = await engine.checkpoint({ checkpoint_id: "c3", episode_ids: R1, stop: false, controller_state: null }).then(
      (reply) => reply,
      (error: unknown) => toCheckpointError(error),
    );
    expect(refusal).toMatchObject({ code: "storage_error", message: expect.stringContaining(ROOT_DEPLOYMENT_FILE) });
    await Promise.all(writers.map((w) => w.settled()));
    expect(await readdir(root)).toEqual([]);
  });
});
