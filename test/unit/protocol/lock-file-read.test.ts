import { mkdtemp, rm, truncate, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { acquireCollectorLock } from "../../../coordinator/collect/collector-lock.js";
import { MAX_LOCK_FILE_BYTES, readIfExists } from "../../../protocol/lock-takeover.js";

let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-lock-read-"));
});
afterEach(async () => {
  await rm(dir, { recursive: true, force: true });
});

/** A sparse file of `bytes` zero bytes: no disk used, but a whole read would take that much memory. */
async function hugeFile(path: string, bytes: number): Promise<void> {
  await writeFile(path, "");
  await truncate(path, bytes);
}

describe("lock file reads", () => {
  it("a lock file far past a lock line is read only up to MAX_LOCK_FILE_BYTES + 1", async () => {
    const path = join(dir, "collector.pid");
    await hugeFile(path, 64 * 1024 * 1024);
    expect((await readIfExists(path))!.length).toBe(MAX_LOCK_FILE_BYTES + 1);
    expect(await readIfExists(join(dir, "absent"))).toBeUndefined();
  });

  it("such a collector.pid is judged unreadable and taken over", async () => {
    await hugeFile(join(dir, "collector.pid"), 64 * 1024 * 1024);
    const lock = await acquireCollectorLock(dir);
    expect(lock.tookOver).toBe("unreadable content");
    await lock.release();
  });
});
