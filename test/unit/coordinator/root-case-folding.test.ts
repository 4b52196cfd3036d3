import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it } from "vitest";
import { refuseCaseFoldingRoot } from "../../../coordinator/publication/case-folding-root.js";

// Checkpoint ids differing only in case (`Ck1`, `ck1`) name one directory `<root>/<id>` on a
// filesystem that folds case: a checkpoint would land in another's directory, and retention of one
// would delete the other. Linux here is case-sensitive: the folding answer is injected.
let root: string;
beforeEach(async () => {
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-root-case-"));
});
afterEach(async () => {
  await rm(root, { recursive: true, force: true });
});

it("a checkpoint root on a case-insensitive filesystem is refused storage_error naming it, and the probe leaves nothing", async () => {
  const asked: string[] = [];
  const folding = async (path: string) => {
    asked.push(path);
    const wanted = path.slice(path.lastIndexOf("/") + 1).toLowerCase();
    return (await readdir(root)).some((name) => name.toLowerCase() === wanted);
  };
  await expect(refuseCaseFoldingRoot(root, folding)).rejects.toMatchObject({
    code: "storage_error",
    message: expect.stringContaining(`checkpoint_root ${root} is on a case-insensitive filesystem`),
  });
  expect(asked).toHaveLength(1);
  expect(asked[0]).toMatch(/\.TRASH-CASE-PROBE\.\d+\.[0-9A-F]{8}$/);
  expect(await readdir(root)).toEqual([]);
});

it("a case-sensitive root (a real one here) passes and keeps nothing of the probe", async () => {
  await expect(refuseCaseFoldingRoot(root)).resolves.toBeUndefined();
  expect(await readdir(root)).toEqual([]);
});
