import { readdir } from "node:fs/promises";
import { filesystemClock, readOnceAdvancing, type DirectoryClock } from "./filesystem-clock.js";
import { STALE_PROBE_AGE_MS, isProbeFileName, removeStaleFiles } from "./stale-probe-files.js";

/**
 * A writeFileAtomic temp file (`.<name>.<pid>.<12 hex>.tmp`) lives from its create to its rename or
 * link; one a crash left there is never renamed, and nothing else removes it. A live writer modifies
 * its temp file with every write; the longest it leaves one untouched is the fsync after its last
 * write, which for a record file of up to 4 GiB on a slow or network disk can take minutes. Ten
 * minutes is far past that, and a leftover waits at most that long past a crash for the next sweep.
 * By age, not by pid, as for probe files (stale-probe-files.ts): the writer may be another process,
 * on another host sharing the directory, and pids are reused.
 */
export const STALE_TEMP_AGE_MS = 10 * 60_000;

/**
 * Removes the temp files in `dir` that `isOurs` claims (by name: fs-durable.ts's tempNameTarget and
 * isTempNameOf tell a writer's own) and that are older than STALE_TEMP_AGE_MS by the directory's own
 * clock (filesystem-clock.ts), then the probe files a crash left there (the clock's own included:
 * nothing else sweeps a step directory or an `--out` directory), with one reading of that clock.
 * Best effort: a directory that cannot be listed, or written (its clock is read with a probe file),
 * or a file that cannot be removed, is left for the next sweep.
 */
export async function removeStaleTempFiles(dir: string, isOurs: (name: string) => boolean, clock: DirectoryClock = filesystemClock): Promise<void> {
  const names = await readdir(dir).catch(() => [] as string[]);
  const once = readOnceAdvancing(clock);
  await removeStaleFiles(dir, names, isOurs, STALE_TEMP_AGE_MS, once);
  await removeStaleFiles(dir, names, isProbeFileName, STALE_PROBE_AGE_MS, once);
}
