import type * as fsPromises from "node:fs/promises";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { StripedLocks } from "../../../participants/kinds/model/index.js";
import { toCheckpointError } from "../../../protocol/index.js";

// The owner file is written (exclusive create) on first use, and a write that failed is tried again
// by the next use. One that fails after its open created the file (a full disk) must not leave that
// file behind: the retry's exclusive create would find it (EEXIST) and fail without a full disk.
let failOwnerWrite = false;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  return withOverrides(actual, {
    writeFile: async (...args: Parameters<typeof actual.writeFile>) => {
      if (!failOwnerWrite || !String(args[0]).includes("/.owner-")) return actual.writeFile(...args);
      await actual.writeFile(args[0], "", args[2]); // the open (wx) created it; the data did not fit
      throw Object.assign(new Error("ENOSPC: no space left on device, write"), { code: "ENOSPC", syscall: "write" });
    },
  });
});

let dir: string;
let locks: StripedLocks;
beforeEach(async () => {
  failOwnerWrite = false;
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-locks-owner-"));
});
afterEach(async () => {
  failOwnerWrite = false;
  await locks.close();
  await rm(dir, { recursive: true, force: true });
});

describe("striped locks: an owner file write that fails", () => {
  it("leaves no owner file, and the next use (disk space back) takes the stripe", async () => {
    locks = new StripedLocks(dir, 4);
    failOwnerWrite = true;
    await expect(locks.run("k", async () => "ran")).rejects.toMatchObject({ code: "ENOSPC" });
    failOwnerWrite = false;
    expect((await readdir(dir)).filter((name) => name.startsWith(".owner-"))).toEqual([]);
    await expect(locks.run("k", async () => "ran")).resolves.toBe("ran");
  });

  it("names the owner file the disk refused, so its storage_error says which disk is full", async () => {
    // Node's writeFile fails on its file handle, whose errors name no path.
    locks = new StripedLocks(dir, 4);
    failOwnerWrite = true;
    const error = await locks.run("k", async () => "ran").then(
      () => undefined,
      (e: unknown) => e,
    );
    const refusal = toCheckpointError(error);
    expect(refusal.code).toBe("storage_error");
    expect(refusal.message).toMatch(new RegExp(`^ENOSPC: no space left on device, write '${join(dir, ".owner-")}[^']+'$`));
  });
});
