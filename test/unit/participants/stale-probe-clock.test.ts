import { mkdtemp, readdir, rm, utimes, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterEach, beforeEach, expect, it, vi } from "vitest";
import { CaptureLedger } from "../../../participants/kinds/model/index.js";
import { refuseCaseFoldingCheckpointRoot } from "../../../participants/storage/case-folding-dir.js";
import { filesystemClock } from "../../../participants/storage/filesystem-clock.js";
import { removeStaleProbeFiles } from "../../../participants/storage/stale-probe-files.js";

// Probe files were judged stale by this process's Date.now() against mtimes the filesystem set: on
// a directory shared over NFS those are the file server's clock (or the writing host's), so a host
// whose clock ran more than a minute ahead removed another host's probe while it ran. Age is now
// judged by the filesystem's own clock: the mtime of a probe file the sweep makes there.
let dir: string;
beforeEach(async () => {
  dir = await mkdtemp(join(tmpdir(), "gym-ckpt-probe-clock-"));
});
afterEach(async () => {
  vi.useRealTimers();
  await rm(dir, { recursive: true, force: true });
});

const LIVE = ".case-probe.999999999.0123456789ae";
const STALE = ".write-probe.999999999.0123456789ad";

/** A live probe (just made) and a stale one (two minutes old by the filesystem's clock). */
async function plant(): Promise<void> {
  await writeFile(join(dir, LIVE), "");
  const old = new Date(Date.now() - 120_000);
  await writeFile(join(dir, STALE), "");
  await utimes(join(dir, STALE), old, old);
}

/** This process's clock, only it, an hour ahead of the filesystem's. */
function clockAhead(): void {
  vi.useFakeTimers({ toFake: ["Date"] });
  vi.setSystemTime(Date.now() + 3_600_000);
}

it("a participant's checkpoint root: with this host's clock an hour ahead, a live probe stays and a stale one goes", async () => {
  await plant();
  clockAhead();
  await refuseCaseFoldingCheckpointRoot(dir);
  expect(await readdir(dir)).toEqual([LIVE]);
});

it("a capture ledger's open: with this host's clock an hour ahead, a live probe stays and a stale one goes", async () => {
  await plant();
  clockAhead();
  const ledger = new CaptureLedger(dir);
  try {
    expect(await ledger.rows("a")).toEqual([]);
  } finally {
    await ledger.close();
  }
  expect((await readdir(dir)).filter((name) => name.startsWith(".") && name !== ".locks").sort()).toEqual([LIVE]);
});

it("where the directory's clock cannot be read (no probe file can be made there), nothing is removed", async () => {
  await plant();
  // /proc: listed, but no file can be made there (the machine's user is root: no mode bits refuse it).
  await expect(filesystemClock("/proc")).resolves.toBeUndefined();
  await removeStaleProbeFiles(dir, [LIVE, STALE], () => filesystemClock("/proc"));
  expect((await readdir(dir)).sort()).toEqual([LIVE, STALE].sort());
});

it("the directory's clock is read off a probe file it removes again", async () => {
  const before = Date.now();
  const now = await filesystemClock(dir);
  expect(now).toBeGreaterThan(before - 1_000);
  expect(now).toBeLessThanOrEqual(Date.now() + 1_000);
  expect(await readdir(dir)).toEqual([]);
});
