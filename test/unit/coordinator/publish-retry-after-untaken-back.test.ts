import { existsSync } from "node:fs";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { toCheckpointError } from "../../../protocol/index.js";
import { verifyCheckpoint } from "../../../coordinator/publication/verify-checkpoint.js";
import { makeEngine, writers } from "./fake-participants.js";

/**
 * A publish op whose checkpoint.json was renamed into place but whose directory's fsync failed, and
 * which could neither remove that checkpoint.json nor rename its directory away, leaves the
 * checkpoint committed and open: the controller retries the publish once the storage answers. That
 * retry published it (LATEST named it), and the retention right after it trashed the whole
 * checkpoint directory, marked for it by the first attempt.
 */
const faults = vi.hoisted(() => ({ on: false, dir: "" }));
const eio = (what: string) => Object.assign(new Error(`EIO: i/o error, ${what}`), { code: "EIO", errno: -5, syscall: what.split(" ")[0] });
vi.mock("../../../coordinator/publication/durable-fs.js", async (importOriginal) => {
  const actual = await importOriginal<typeof import("../../../coordinator/publication/durable-fs.js")>();
  return {
    ...actual,
    // checkpoint.json renamed into place, then its directory's fsync fails.
    replaceSmallFileDurably: async (...args: Parameters<typeof actual.replaceSmallFileDurably>) => {
      await actual.replaceSmallFileDurably(...args);
      if (faults.on && String(args[0]).endsWith("checkpoint.json")) throw eio(`fsync '${faults.dir}'`);
    },
  };
});
vi.mock("node:fs/promises", async (importOriginal) => {
  const real = await importOriginal<typeof import("node:fs/promises")>();
  const rm = (async (...args: Parameters<typeof real.rm>) => {
    if (faults.on && String(args[0]) === join(faults.dir, "checkpoint.json")) throw eio(`unlink '${String(args[0])}'`);
    return real.rm(...args);
  }) as typeof real.rm;
  return { ...real, default: { ...real, rm }, rm };
});
vi.mock("node:fs", async (importOriginal) => {
  const real = await importOriginal<typeof import("node:fs")>();
  const renameSync = ((from: string, to: string) => {
    if (faults.on && String(from) === faults.dir) throw eio(`rename '${from}'`);
    return real.renameSync(from, to);
  }) as typeof real.renameSync;
  return { ...real, default: { ...real, renameSync }, renameSync };
});

let root: string;
beforeEach(async () => {
  faults.on = false;
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-publish-retry-"));
});
afterEach(async () => {
  faults.on = false;
  await Promise.all(writers.splice(0).map((w) => w.settled()));
  await rm(root, { recursive: true, force: true });
});

describe("a publish retried after a failed one whose checkpoint.json could not be taken back", () => {
  it("publishes the checkpoint, LATEST names it, and its directory stays", async () => {
    const made = makeEngine(root);
    await made.engine.checkpoint({ checkpoint_id: "ok1", episode_ids: null, stop: false, controller_state: null });
    await made.engine.prepare({ checkpoint_id: "c2" });
    await made.engine.commit({ checkpoint_id: "c2", episode_ids: null, stop: false });
    faults.dir = join(root, "c2");
    faults.on = true;
    const refusal = await made.engine.publish({ checkpoint_id: "c2", controller_state: null }).then(
      () => undefined,
      (error: unknown) => toCheckpointError(error),
    );
    faults.on = false;
    expect(refusal?.code).toBe("storage_error");

    const reply = await made.engine.publish({ checkpoint_id: "c2", controller_state: null });
    expect(reply.checkpoint_id).toBe("c2");
    await made.writer.settled();
    expect(await made.catalog.latest()).toBe("c2");
    expect(existsSync(join(root, "c2", "checkpoint.json"))).toBe(true);
    expect((await verifyCheckpoint(made.catalog, "c2")).checkpoint_id).toBe("c2");
    await made.engine.resume({ checkpoint_id: "c2" });
  });
});
