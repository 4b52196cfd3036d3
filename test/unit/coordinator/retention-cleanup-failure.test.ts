import { mkdtemp, readdir } from "node:fs/promises";
import * as fsPromises from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { CheckpointCatalog } from "../../../coordinator/publication/checkpoint-catalog.js";
import { GlobalManifestWriter } from "../../../coordinator/publication/global-manifest-writer.js";
import { writeParticipant } from "./fake-participants.js";

// Removing a trashed checkpoint fails while `failRemoval` is set (as on an I/O error or a
// read-only remount); as root in CI a permission trick would not fail, so `rm` is wrapped.
let failRemoval = false;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  return withOverrides(actual, {
    rm: (path: string, options?: Parameters<typeof actual.rm>[1]) =>
      failRemoval && String(path).includes(".trash-") ? Promise.reject(Object.assign(new Error(`EIO: i/o error, rm '${path}'`), { code: "EIO" })) : actual.rm(path, options),
  });
});

// Renaming one checkpoint's directory away fails while `failRename` names it (a mount point there,
// EBUSY; an immutable directory, EPERM): root renames anything, so `renameSync` is wrapped.
let failRename: string | undefined;
vi.mock("node:fs", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof import("node:fs")>();
  const renameSync = ((from: string, to: string) => {
    if (failRename !== undefined && String(from).endsWith(`/${failRename}`)) throw Object.assign(new Error(`EBUSY: resource busy or locked, rename '${from}'`), { code: "EBUSY", syscall: "rename" });
    actual.renameSync(from, to);
  }) as typeof actual.renameSync;
  return withOverrides(actual, { renameSync });
});

let root: string;
beforeEach(async () => {
  failRemoval = false;
  failRename = undefined;
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-retention-"));
});
afterEach(async () => {
  failRemoval = false;
  await fsPromises.rm(root, { recursive: true, force: true });
});

async function publish(writer: GlobalManifestWriter, id: string, at: number): Promise<void> {
  const entry = await writeParticipant(root, id, "agent", "a1", []);
  await writer.publish({ checkpointId: id, epoch: 1, preparedAt: at - 1, publishedAt: at, stop: false, scope: null, restarts: [], participants: [entry], controllerState: null });
}

describe("retention clean-up failures", () => {
  it("are reported, not swallowed, and the removal is retried after the next publication", async () => {
    const errors: unknown[] = [];
    const writer = new GlobalManifestWriter(new CheckpointCatalog(root), 1, (error) => errors.push(error));
    await publish(writer, "c1", 100);
    await publish(writer, "c2", 200);
    failRemoval = true;
    expect(writer.retain("c2")).toEqual(["c1"]);
    await writer.settled();
    expect(errors).toHaveLength(1);
    expect((errors[0] as NodeJS.ErrnoException).code).toBe("EIO");
    expect((await readdir(root)).filter((n) => n.startsWith(".trash-c1."))).toHaveLength(1);

    failRemoval = false;
    await publish(writer, "c3", 300);
    expect(writer.retain("c3")).toEqual(["c2"]);
    await writer.settled();
    expect(errors).toHaveLength(1);
    expect((await readdir(root)).filter((n) => n.startsWith(".trash-"))).toEqual([]);
  });

  it("one checkpoint that cannot be renamed away is reported and does not keep the others from being deleted", async () => {
    const errors: unknown[] = [];
    const writer = new GlobalManifestWriter(new CheckpointCatalog(root), 1, (error) => errors.push(error));
    for (const [id, at] of [["c1", 100], ["c2", 200], ["c3", 300], ["c4", 400]] as const) await publish(writer, id, at);
    failRename = "c3";
    expect(writer.retain("c4")).toEqual(["c1", "c2"]);
    await writer.settled();
    expect(errors.map((e) => (e as NodeJS.ErrnoException).code)).toEqual(["EBUSY"]);
    expect((await readdir(root)).sort()).toEqual(["LATEST", "c3", "c4"]);

    failRename = undefined;
    await publish(writer, "c5", 500);
    expect(writer.retain("c5")).toEqual(["c3", "c4"]);
  });
});
