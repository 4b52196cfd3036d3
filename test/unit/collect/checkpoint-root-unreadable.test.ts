import * as fsPromises from "node:fs/promises";
import { mkdir, mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { assertCheckpointVisible } from "../../../coordinator/collect/checkpoint-root.js";
import { CheckpointError, toCheckpointError } from "../../../protocol/index.js";

// stat of the checkpoint fails with `failStat` while set (an I/O error, a permission the mount
// denies): root passes any permission check, so `stat` is wrapped.
let failStat: string | undefined;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  return withOverrides(actual, {
    stat: (path: string, options?: Parameters<typeof actual.stat>[1]) =>
      failStat !== undefined
        ? Promise.reject(Object.assign(new Error(`${failStat}: failed, stat '${path}'`), { code: failStat, syscall: "stat", path }))
        : actual.stat(path, options),
  });
});

let root: string;
beforeEach(async () => {
  failStat = undefined;
  root = await mkdtemp(join(tmpdir(), "gym-ckpt-root-"));
});
afterEach(async () => {
  failStat = undefined;
  await rm(root, { recursive: true, force: true });
});

describe("assertCheckpointVisible", () => {
  it("passes for a checkpoint directory under the root, and refuses a missing one invalid_request", async () => {
    await mkdir(join(root, "c1"));
    await assertCheckpointVisible(root, "c1");
    await expect(assertCheckpointVisible(root, "c2")).rejects.toMatchObject({ code: "invalid_request" });
  });

  it.each(["EIO", "EACCES", "ESTALE"])("refuses a stat failing %s as storage_error, not calling the root another directory", async (code) => {
    await mkdir(join(root, "c1"));
    failStat = code;
    const error = await assertCheckpointVisible(root, "c1").then(
      () => undefined,
      (e: unknown) => e,
    );
    expect(error).toBeDefined();
    expect(error instanceof CheckpointError && error.code === "invalid_request").toBe(false);
    expect(toCheckpointError(error).code).toBe("storage_error");
    expect(toCheckpointError(error).message).toContain(code);
  });
});
