import * as fsPromises from "node:fs/promises";
import { mkdir, writeFile } from "node:fs/promises";
import path from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { GLOBAL_MANIFEST_FILE, toCheckpointError } from "../../../protocol/index.js";
import { exportCheckpointSeeds, ReplayError } from "../../../participants/replay/index.js";
import { tempDir } from "./fixtures.js";

// Opening checkpoint.json fails with `failOpen` while it is set (an I/O error, a stale NFS handle,
// an account without read permission: root in CI reads anything, so `open` is wrapped).
let failOpen: string | undefined;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  const open = ((file: string, ...rest: unknown[]) =>
    failOpen !== undefined && String(file).endsWith(`/${GLOBAL_MANIFEST_FILE}`)
      ? Promise.reject(Object.assign(new Error(`${failOpen}: refused, open '${file}'`), { code: failOpen, errno: -5, syscall: "open", path: file }))
      : (actual.open as (...a: unknown[]) => unknown)(file, ...rest)) as typeof actual.open;
  return withOverrides(actual, { open });
});

let root: string;
let cleanup: () => Promise<void>;
beforeEach(async () => {
  failOpen = undefined;
  ({ dir: root, cleanup } = await tempDir());
});
afterEach(() => cleanup());

/**
 * docs/replay.md (`gym-ckpt seeds`): a file call the storage refused is `storage_error`, exit 1;
 * `invalid_request`, exit 2, is a directory that is not a published checkpoint. A checkpoint.json
 * that is there but cannot be read (EIO, EACCES) was reported as "holds no checkpoint.json (not a
 * published checkpoint)", invalid_request: the operator was told to fix the flag, not the storage.
 */
describe("exportCheckpointSeeds: checkpoint.json the storage refuses", () => {
  it.each(["EIO", "EACCES", "ESTALE"])("%s is storage_error, not 'not a published checkpoint'", async (code) => {
    const dir = path.join(root, "cp-1");
    await mkdir(dir);
    await writeFile(path.join(dir, GLOBAL_MANIFEST_FILE), "{}");
    failOpen = code;
    const error = await exportCheckpointSeeds(dir).then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeDefined();
    expect(error).not.toBeInstanceOf(ReplayError);
    expect(toCheckpointError(error)).toMatchObject({ code: "storage_error", message: expect.stringContaining(code) });
  });

  it("a directory without checkpoint.json is still invalid_request (not a published checkpoint)", async () => {
    const dir = path.join(root, "empty");
    await mkdir(dir);
    await expect(exportCheckpointSeeds(dir)).rejects.toMatchObject({ code: "invalid_request", message: expect.stringContaining("not a published checkpoint") });
    await expect(exportCheckpointSeeds(path.join(root, "missing"))).rejects.toMatchObject({ code: "invalid_request" });
  });
});
