import { existsSync, readdirSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { toCheckpointError } from "../../../protocol/index.js";
import { makeEngine, writers } from "./fake-participants.js";

/**
 * A checkpoint that fails after some participants committed (one's disk is full: storage_error)
 * leaves their files in its directory. Left for the next publication's retention, as before, those
 * files stayed on a disk that checkpoints had filled, where every later attempt failed alike and
 * left more: no publication ever came to delete them. An abandoned checkpoint (resumed unpublished,
 * its decision withdrawn or never made) is taken away when it closes, by its leader only.
 */
// While set, writing checkpoint.json fails as a full disk does (nothing renamed into place).
let checkpointJsonFull = false;
vi.mock("../../../coordinator/publication/durable-fs.js", async (importOriginal) => {
  const actual = await importOriginal<typeof import("../../../coordinator/publication/durable-fs.js")>();
  return {
    ...actual,
    replaceSmallFileDurably: async (...args: Parameters<typeof actual.replaceSmallFileDurably>) => {
      if (checkpointJsonFull && String(args[0]).endsWith("checkpoint.json")) {
        throw Object.assign(new Error(`ENOSPC: no space left on device, write '${String(args[0])}.tmp'`), { code: "ENOSPC", syscall: "write" });
      }
      return actual.replaceSmallFileDurably(...args);
    },
  };
});

let root: string;
beforeEach(async () => {
  checkpointJsonFull = false;
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-abandoned-dir-"));
});
afterEach(async () => {
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

const refusalOf = (work: Promise<unknown>) =>
  work.then(
    () => {
      throw new Error("expected a refusal");
    },
    (error: unknown) => toCheckpointError(error),
  );

describe("the directory of a checkpoint abandoned after commits", () => {
  it("checkpoint op refused storage_error at one participant: the others' files go with their directory; LATEST and the published checkpoint stay", async () => {
    const made = makeEngine(root);
    await made.engine.checkpoint({ checkpoint_id: "ok1", episode_ids: null, stop: false, controller_state: null });
    made.fake.set("model", "m1", "commit", { error: "storage_error" });
    const refusal = await refusalOf(made.engine.checkpoint({ checkpoint_id: "full1", episode_ids: null, stop: false, controller_state: null }));
    expect(refusal.code).toBe("storage_error");
    await made.writer.settled();
    expect(existsSync(join(root, "full1"))).toBe(false);
    expect(readdirSync(root).filter((name) => name.startsWith(".trash-"))).toEqual([]);
    expect(await made.catalog.latest()).toBe("ok1");
    expect(existsSync(join(root, "ok1", "checkpoint.json"))).toBe(true);
  });

  it("checkpoint op whose checkpoint.json the disk refuses: every participant's files go with the directory", async () => {
    const made = makeEngine(root);
    await made.engine.checkpoint({ checkpoint_id: "ok2", episode_ids: null, stop: false, controller_state: null });
    checkpointJsonFull = true;
    const refusal = await refusalOf(made.engine.checkpoint({ checkpoint_id: "full3", episode_ids: null, stop: false, controller_state: null }));
    expect(refusal.code).toBe("storage_error");
    await made.writer.settled();
    expect(existsSync(join(root, "full3"))).toBe(false);
    expect(await made.catalog.latest()).toBe("ok2");
  });

  it("commit op refused, then the controller's resume abandons it: its directory goes at the resume", async () => {
    const made = makeEngine(root);
    made.fake.set("model", "m1", "commit", { error: "storage_error" });
    await made.engine.prepare({ checkpoint_id: "full2" });
    expect((await refusalOf(made.engine.commit({ checkpoint_id: "full2", episode_ids: null, stop: false }))).code).toBe("storage_error");
    await made.writer.settled();
    expect(readdirSync(join(root, "full2"))).toEqual(["gym"]); // kept for a retried commit
    await made.engine.resume({ checkpoint_id: "full2" });
    await made.writer.settled();
    expect(existsSync(join(root, "full2"))).toBe(false);
  });

  // The rest of a checkpoint directory is the controller's (docs/api.md): a state file it wrote there
  // for the publish stays, as a fresh prepare's clean-up of an earlier attempt leaves it; only the
  // participants' gym/ goes, and the directory once nothing else is in it.
  it("commit refused after the controller wrote its state file there: the resume takes gym/ away and leaves the state file", async () => {
    const made = makeEngine(root);
    made.fake.set("model", "m1", "commit", { error: "storage_error" });
    await made.engine.prepare({ checkpoint_id: "full4" });
    expect((await refusalOf(made.engine.commit({ checkpoint_id: "full4", episode_ids: null, stop: false }))).code).toBe("storage_error");
    const { writeFileSync } = await import("node:fs");
    writeFileSync(join(root, "full4", "trainer.json"), "{}\n");
    await made.engine.resume({ checkpoint_id: "full4" });
    await made.writer.settled();
    expect(readdirSync(join(root, "full4"))).toEqual(["trainer.json"]);
    expect(readdirSync(root).filter((name) => name.startsWith(".trash-"))).toEqual([]);
  });

  it("a directory that is not a partial checkpoint (a controller's own files, no gym/) is left alone", async () => {
    const made = makeEngine(root);
    made.fake.set("model", "m1", "prepare", { error: "storage_error" });
    const { mkdirSync, writeFileSync } = await import("node:fs");
    mkdirSync(join(root, "mine"));
    writeFileSync(join(root, "mine", "state.json"), "{}\n");
    await refusalOf(made.engine.checkpoint({ checkpoint_id: "mine", episode_ids: null, stop: false, controller_state: null }));
    await made.writer.settled();
    expect(readdirSync(join(root, "mine"))).toEqual(["state.json"]);
  });
});
