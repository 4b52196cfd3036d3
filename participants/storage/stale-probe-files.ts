import { lstat, unlink } from "node:fs/promises";
import { join } from "node:path";
import { filesystemClock, type DirectoryClock } from "./filesystem-clock.js";

/**
 * A probe file (`.case-probe.<pid>.<hex>`, `.write-probe.<pid>.<hex>`, `.clock-probe.<pid>.<hex>`)
 * lives the milliseconds between its create and its remove; one older than this was left by a
 * process that crashed in between. By age, not by pid: a pid does not say whether it is another
 * process now (pids are reused, a restarted container is PID 1 again), nor anything about a process
 * on another host sharing the directory.
 */
export const STALE_PROBE_AGE_MS = 60_000;

const PROBE_NAME = /^\.(?:case|write|clock)-probe\.[0-9]+\.[0-9a-f]{12}$/;

/** Whether `name` is a probe file's name. */
export function isProbeFileName(name: string): boolean {
  return PROBE_NAME.test(name);
}

/** Removes the probe files among `names` (in `dir`) older than STALE_PROBE_AGE_MS; a failure keeps one for the next open. */
export async function removeStaleProbeFiles(dir: string, names: Iterable<string>, clock: DirectoryClock = filesystemClock): Promise<void> {
  await removeStaleFiles(dir, names, isProbeFileName, STALE_PROBE_AGE_MS, clock);
}

/**
 * Removes the regular files among `names` (in `dir`) that `matches` and that were last modified more
 * than `ageMs` ago (a live writer's file is modified by its every write); a failure keeps one for the
 * next time. Shared by the probe files above and writers' temp files (stale-temp-files.ts).
 *
 * "Ago" by the directory's own clock (filesystem-clock.ts), read once the first candidate is found,
 * so a sweep with nothing to judge writes nothing; where it cannot be read, nothing is removed.
 */
export async function removeStaleFiles(dir: string, names: Iterable<string>, matches: (name: string) => boolean, ageMs: number, clock: DirectoryClock = filesystemClock): Promise<void> {
  let now: number | undefined | null = null; // null: not read yet
  for (const name of names) {
    if (!matches(name)) continue;
    // Read before the candidate's mtime: a write landing in between only makes it look younger.
    if (now === null) now = await clock(dir);
    if (now === undefined) return;
    const path = join(dir, name);
    const stat = await lstat(path).catch(() => undefined);
    if (stat?.isFile() && stat.mtimeMs < now - ageMs) await unlink(path).catch(() => undefined);
  }
}
