import { randomBytes } from "node:crypto";
import { constants } from "node:fs";
import { open, unlink } from "node:fs/promises";
import { join } from "node:path";

/**
 * "Now" as the filesystem holding `dir` keeps time, in mtime milliseconds; undefined where it cannot
 * be told. A seam for tests.
 */
export type DirectoryClock = (dir: string) => Promise<number | undefined>;

/**
 * Reads the time off a probe file made in `dir` (`.clock-probe.<pid>.<12 hex>`, created exclusively,
 * never through a symlink), then removes it. A sweep judging a file's age by its mtime must compare
 * it with this, not this process's Date.now(): on a directory shared over NFS mtimes are the file
 * server's clock (or the writing host's), and a host whose clock runs ahead would take a live
 * writer's file for a stale one. Undefined when no probe can be made there (a directory this process
 * may only read): nothing can be judged stale then. A probe a crash left is removed by the probe
 * sweep (stale-probe-files.ts), whose names it shares.
 */
export const filesystemClock: DirectoryClock = async (dir) => {
  const path = join(dir, `.clock-probe.${process.pid}.${randomBytes(6).toString("hex")}`);
  const handle = await open(path, constants.O_WRONLY | constants.O_CREAT | constants.O_EXCL | (constants.O_NOFOLLOW ?? 0), 0o600).catch(() => undefined);
  if (handle === undefined) return undefined;
  try {
    const { mtimeMs } = await handle.stat();
    return Number.isFinite(mtimeMs) && mtimeMs > 0 ? mtimeMs : undefined;
  } catch {
    return undefined;
  } finally {
    await handle.close().catch(() => undefined);
    await unlink(path).catch(() => undefined);
  }
};

/**
 * `clock` read once (and only if asked), then advanced by this process's monotonic clock: a sweep
 * applying several rules, or a wait that judges a file's age at every look (striped locks, every few
 * milliseconds), makes one probe, not one per rule or look, and the age it sees still grows. A failed
 * reading is not kept: the next look tries again. Every reading is of the first `dir` asked about.
 */
export function readOnceAdvancing(clock: DirectoryClock): DirectoryClock {
  let reading: Promise<{ now: number; at: number } | undefined> | undefined;
  return async (dir) => {
    // `at` once the reading is back: the probe's mtime is no later, so the file system's time is never overestimated.
    reading ??= clock(dir).then((now) => (now === undefined ? undefined : { now, at: performance.now() }));
    const read = await reading;
    if (read === undefined) {
      reading = undefined;
      return undefined;
    }
    return read.now + (performance.now() - read.at);
  };
}
