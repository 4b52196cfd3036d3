import { mkdir, mkdtemp, readFile, rm, stat, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";
import { refusalOf } from "../../support/refusal.js";

let base: string;
beforeEach(async () => {
  base = await mkdtemp(join(tmpdir(), "gym-ckpt-stage-dir-"));
});
afterEach(async () => {
  await rm(base, { recursive: true, force: true });
});

describe("GlobalManifestWriter.checkpointDirectory", () => {
  // "A failed mkdir is staged again once, so a passing failure does not refuse every retried
  // commit": the root missing while the prepare staged (storage mounting late), there by the commit.
  it("stages a failed mkdir again: the directory is made once the root is back", async () => {
    const root = join(base, "root");
    const writer = new GlobalManifestWriter(new CheckpointCatalog(root), 5);
    writer.stage("c1"); // ENOENT: no root yet
    await mkdir(root);
    await writer.checkpointDirectory("c1");
    expect((await stat(join(root, "c1"))).isDirectory()).toBe(true);
    await writer.discard("c1");
  });

  // Something not a directory in its place is refused checkpoint_conflict ("nothing was
  // committed"), never taken for the checkpoint directory, and left as it is.
  it("refuses a file where the checkpoint directory goes (checkpoint_conflict) and leaves it", async () => {
    const writer = new GlobalManifestWriter(new CheckpointCatalog(base), 5);
    await writeFile(join(base, "c1"), "an operator's file");
    expect(await refusalOf(writer.checkpointDirectory("c1"))).toMatchObject({ code: "checkpoint_conflict", message: expect.stringContaining("is not a directory") });
    expect(await readFile(join(base, "c1"), "utf8")).toBe("an operator's file");
    await writer.discard("c1");
  });

  // An abandoned checkpoint's discard (mayDelete) looks into the directory to tell a partial
  // checkpoint: a lookup that fails there (a file in its place: ENOTDIR; EIO, EACCES) is a clean-up
  // failure reported, not a rejected clean-up chain (every later discard skipped, and the engine's
  // `void discard(...)` an unhandled rejection).
  it("an abandoned checkpoint's discard with a file in its directory's place leaves it and reports, the chain going on", async () => {
    const errors: unknown[] = [];
    const writer = new GlobalManifestWriter(new CheckpointCatalog(base), 5, (error) => errors.push(error));
    await writeFile(join(base, "c1"), "an operator's file");
    writer.stage("c1");
    await refusalOf(writer.checkpointDirectory("c1"));
    await expect(writer.discard("c1", () => true)).resolves.toBeUndefined();
    expect(await readFile(join(base, "c1"), "utf8")).toBe("an operator's file");
    expect(errors).toEqual([expect.objectContaining({ code: "ENOTDIR" })]);
    writer.stage("c2");
    await writer.checkpointDirectory("c2");
    await writer.discard("c2", () => true);
    await expect(stat(join(base, "c2"))).rejects.toMatchObject({ code: "ENOENT" });
  });
});

describe("GlobalManifestWriter.publish, an inline controller state", () => {
  // The controller's state is stored as given: a falsy value (0, false, "") is a state, not "none"
  // (only an absent one becomes null).
  it("keeps a falsy inline state as it is", async () => {
    const writer = new GlobalManifestWriter(new CheckpointCatalog(base), 5);
    for (const [id, inline] of [["c0", 0], ["cf", false], ["ce", ""]] as const) {
      await mkdir(join(base, id));
      const { manifest } = await writer.publish({ checkpointId: id, epoch: 1, preparedAt: 1, publishedAt: 2, stop: false, scope: null, restarts: [], participants: [], controllerState: { inline } });
      expect(manifest.controller_state).toEqual({ inline });
      expect(JSON.parse(await readFile(join(base, id, "checkpoint.json"), "utf8")).controller_state).toEqual({ inline });
    }
    await writer.settled();
  });
});
