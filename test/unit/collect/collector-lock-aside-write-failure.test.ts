import type * as fsPromises from "node:fs/promises";
import { mkdtemp, readdir, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { acquireCollectorLock } from "../../../coordinator/collect/collector-lock.js";
import { toCheckpointError } from "../../../protocol/index.js";

// The lock line is written aside before it is linked into place. A write that fails after its
// exclusive open created the file (a full disk) must not leave that aside file in the checkpoint root.
let failWrite = false;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  return withOverrides(actual, {
    writeFile: async (...args: Parameters<typeof actual.writeFile>) => {
      if (!failWrite) return actual.writeFile(...args);
      await actual.writeFile(args[0], "", args[2]); // the open (wx) created it; the data did not fit
      throw Object.assign(new Error(`ENOSPC: no space left on device, write`), { code: "ENOSPC", syscall: "write" });
    },
  });
});

let dir: string;
beforeEach(async () => {
  failWrite = false;
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-collector-lock-aside-"));
});
afterEach(async () => {
  failWrite = false;
  await rm(dir, { recursive: true, force: true });
});

describe("collector lock: a failed aside write", () => {
  it("refuses the start and leaves no file behind; the retried start takes the lock", async () => {
    failWrite = true;
    await expect(acquireCollectorLock(dir)).rejects.toMatchObject({ code: "ENOSPC" });
    failWrite = false;
    expect(await readdir(dir)).toEqual([]);
    const lock = await acquireCollectorLock(dir);
    expect(await readdir(dir)).toEqual(["collector.pid"]);
    await lock.release();
  });

  it("names the file the disk refused: `error storage_error: ENOSPC: …, write '<root>/.collector.pid.…'`", async () => {
    // Node's writeFile fails on its file handle, whose errors name no path: the operator would read
    // only "ENOSPC: no space left on device, write", not which disk is full.
    failWrite = true;
    const error = await acquireCollectorLock(dir).then(
      () => undefined,
      (e: unknown) => e,
    );
    const refusal = toCheckpointError(error);
    expect(refusal.code).toBe("storage_error");
    expect(refusal.message).toMatch(new RegExp(`^ENOSPC: no space left on device, write '${join(dir, ".collector.pid.")}[0-9a-f]+'$`));
  });
});
