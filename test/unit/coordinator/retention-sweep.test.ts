import { mkdtemp, mkdir, readdir, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { ROOT_DEPLOYMENT_FILE } from "../../../protocol/index.js";
import { LEFTOVER_TEMP_AGE_MS, removeTrash, TRASH_PREFIX } from "../../../coordinator/publication/retention.js";

let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-sweep-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

describe("removeTrash", () => {
  it("keeps another writer's fresh LATEST temp (its staging under way), removes a crashed writer's old one, the trash and never its own in use", async () => {
    const fresh = join(root, ".LATEST.111.aaaa.tmp");
    const old = join(root, ".LATEST.222.bbbb.tmp");
    const mine = join(root, ".LATEST.333.cccc.tmp");
    for (const file of [fresh, old, mine]) await writeFile(file, "c1");
    const longAgo = (Date.now() - LEFTOVER_TEMP_AGE_MS - 1000) / 1000;
    await utimes(old, longAgo, longAgo);
    await utimes(mine, longAgo, longAgo);
    await mkdir(join(root, `${TRASH_PREFIX}c0.1234`));
    await writeFile(join(root, "dispatch.log"), "a controller's file");
    await removeTrash(root, new Set([mine]));
    expect((await readdir(root)).sort()).toEqual([".LATEST.111.aaaa.tmp", ".LATEST.333.cccc.tmp", "dispatch.log"]);
  });
});

describe("removeTrash, the root's deployment claim", () => {
  it("removes an old temp file of the claim a coordinator crashed while writing, keeps a fresh one and the claim itself", async () => {
    const claim = join(root, ROOT_DEPLOYMENT_FILE);
    const old = join(root, `.${ROOT_DEPLOYMENT_FILE}.222.bbbb.tmp`);
    const fresh = join(root, `.${ROOT_DEPLOYMENT_FILE}.111.aaaa.tmp`);
    for (const file of [claim, old, fresh]) await writeFile(file, '{"deployment":"job"}\n');
    const longAgo = (Date.now() - LEFTOVER_TEMP_AGE_MS - 1000) / 1000;
    await utimes(old, longAgo, longAgo);
    await utimes(claim, longAgo, longAgo);
    await removeTrash(root, new Set());
    expect((await readdir(root)).sort()).toEqual([`.${ROOT_DEPLOYMENT_FILE}.111.aaaa.tmp`, ROOT_DEPLOYMENT_FILE].sort());
  });
});

describe("removeTrash, what it leaves alone", () => {
  // "Nothing else at the root is touched": only the temp files of LATEST and of the deployment claim
  // are swept, not any old file a controller keeps at the root that happens to end in .tmp, nor
  // one that starts like LATEST's temp but is not one.
  it("keeps a controller's old *.tmp file and an old dot-LATEST file that is no temp file", async () => {
    const longAgo = (Date.now() - LEFTOVER_TEMP_AGE_MS - 1000) / 1000;
    for (const name of ["results.tmp", ".LATEST.notes"]) {
      await writeFile(join(root, name), "a controller's file");
      await utimes(join(root, name), longAgo, longAgo);
    }
    await removeTrash(root, new Set());
    expect((await readdir(root)).sort()).toEqual([".LATEST.notes", "results.tmp"]);
  });

  // A root not created yet has nothing to sweep; one that cannot be listed is a failure the caller
  // sees as such (its own errno), not an empty sweep nor a TypeError.
  it("resolves on a missing root and rejects with the listing's own error on a root that is no directory", async () => {
    await expect(removeTrash(join(root, "absent"), new Set())).resolves.toBeUndefined();
    const file = join(root, "a-file");
    await writeFile(file, "x");
    await expect(removeTrash(file, new Set())).rejects.toMatchObject({ code: "ENOTDIR" });
  });
});
