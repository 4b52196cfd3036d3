import { existsSync } from "node:fs";
import * as fsPromises from "node:fs/promises";
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { waitUntil } from "../../support/wait-until.js";
import { StripedLocks } from "../../../participants/kinds/model/index.js";

// Removing a lock file fails while `failLockUnlinks` > 0 (an I/O error): root removes anything, so `unlink` is wrapped.
let failLockUnlinks = 0;
let failedLockUnlinks = 0;
vi.mock("node:fs/promises", async (importOriginal) => {
  const { withOverrides } = await import("../../support/fs-mock.js");
  const actual = await importOriginal<typeof fsPromises>();
  return withOverrides(actual, {
    unlink: (path: Parameters<typeof actual.unlink>[0]) => {
      if (failLockUnlinks > 0 && String(path).endsWith(".lock")) {
        failLockUnlinks -= 1;
        failedLockUnlinks += 1;
        return Promise.reject(Object.assign(new Error(`EIO: i/o error, unlink '${String(path)}'`), { code: "EIO", syscall: "unlink", path: String(path) }));
      }
      return actual.unlink(path);
    },
  });
});

let dir: string;
let locks: StripedLocks;
let failures: string[];
beforeEach(async () => {
  failLockUnlinks = 0;
  failedLockUnlinks = 0;
  failures = [];
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-locks-release-"));
});
afterEach(async () => {
  failLockUnlinks = 0;
  await locks.close();
  await rm(dir, { recursive: true, force: true });
});

describe("a stripe whose lock file cannot be removed", () => {
  it("stays owned (usable at once, not waited on as another owner's), is reported, and is released by a later sweep", async () => {
    locks = new StripedLocks(join(dir, "locks"), 4, 300, 20, (file, error) => failures.push(`${file}: ${(error as NodeJS.ErrnoException).code}`));
    const stripe = locks.stripeOf("k");
    const file = locks.lockFile(stripe);
    failLockUnlinks = 1;
    expect(await locks.run("k", async () => "first")).toBe("first");
    await waitUntil(() => failedLockUnlinks === 1, "the idle release to fail");
    // The file still names this process: the stripe is still ours, in memory as on disk.
    expect(existsSync(file)).toBe(true);
    expect(locks.ownedStripes()).toEqual([stripe]);
    expect(failures).toEqual([`${file}: EIO`]);
    // Its next use runs at once (before, it waited out the 300 ms and failed: "held by another live process").
    expect(await locks.run("k", async () => "second")).toBe("second");
    // The next idle release succeeds.
    // The file goes first, the stripe leaves the owned set when the unlink's promise settles after it.
    await waitUntil(() => !existsSync(file) && locks.ownedStripes().length === 0, "the retried release");
    expect(existsSync(file)).toBe(false);
  });

  it("close() still resolves, and leaves the stripe owned for the exit hook", async () => {
    locks = new StripedLocks(join(dir, "locks"), 4, 300, 60_000, (file) => failures.push(file));
    await locks.run("k", async () => undefined);
    failLockUnlinks = 1;
    await expect(locks.close()).resolves.toBeUndefined();
    expect(failures).toEqual([locks.lockFile(locks.stripeOf("k"))]);
    expect(locks.ownedStripes()).toEqual([locks.stripeOf("k")]);
    locks.releaseAllSync();
    expect(existsSync(locks.lockFile(locks.stripeOf("k")))).toBe(false);
  });
});
