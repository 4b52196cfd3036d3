import { readFileSync } from "node:fs";
import { hostname } from "node:os";

/**
 * Who wrote a lock file, beyond its pid. A pid alone is not enough: after a reboot or in a
 * restarted container pids start over (PID 1 again), and after a crash an unrelated process may
 * get the dead owner's pid; a lock judged by its pid would then stay held for good. The start time
 * of the process (/proc/<pid>/stat field 22, clock ticks since boot) and the boot id tell the owner
 * from a later process with its pid. Shared by the collector's `collector.pid` and the model
 * participant's stripe locks, and the line naming a process (`processLine`) that `collector.pid`
 * and the take-over entries of both locks hold (lock-takeover.ts). Reads this host's /proc (Linux; elsewhere there is no identity and
 * liveness falls back to the pid); not exported by index.ts.
 */
export interface ProcessIdentity {
  startTime: string;
  bootId: string;
}

/** What /proc/<pid>/stat's field 22 and /proc/sys/kernel/random/boot_id hold; anything else is no identity. */
const START_TIME = /^[0-9]{1,20}$/;
const BOOT_ID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** When process `pid` started; undefined where there is no such process, or no /proc. */
export function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name (field 2) may hold spaces and parentheses: count from the last ")".
    const start = stat.slice(stat.lastIndexOf(")") + 2).split(" ")[19];
    return start !== undefined && START_TIME.test(start) ? start : undefined;
  } catch {
    return undefined;
  }
}

let bootIdRead = false;
let bootId: string | undefined;

/** This boot of this host, read once. */
export function currentBootId(): string | undefined {
  if (!bootIdRead) {
    bootIdRead = true;
    try {
      const text = readFileSync("/proc/sys/kernel/random/boot_id", "utf8").trim();
      bootId = BOOT_ID.test(text) ? text : undefined;
    } catch {
      bootId = undefined;
    }
  }
  return bootId;
}

/** The identity of process `pid` (this one by default): both parts or none. */
export function processIdentity(pid: number = process.pid): ProcessIdentity | undefined {
  const startTime = processStartTime(pid);
  const boot = currentBootId();
  return startTime !== undefined && boot !== undefined ? { startTime, bootId: boot } : undefined;
}

/** Two recorded fields as an identity, or undefined when they are not one (the caller's strict format decides what that means). */
export function parseProcessIdentity(startTime: string, bootIdText: string): ProcessIdentity | undefined {
  return START_TIME.test(startTime) && BOOT_ID.test(bootIdText) ? { startTime, bootId: bootIdText } : undefined;
}

/** The highest pid kill(2) takes (Linux itself stops at 2^22). */
const MAX_PID = 2 ** 31 - 1;

/**
 * Why the process that recorded `pid` (and, where it recorded one, `identity`) no longer runs on
 * this host; undefined while it may. With an identity: written before this boot, or the pid's
 * process now started at another time, is another process. Without one (an older file, or no
 * /proc), or when the pid's start time cannot be read: kill(pid, 0), where EPERM is alive (another
 * user's process).
 */
export function whyOwnerGone(pid: number, identity: ProcessIdentity | undefined): string | undefined {
  // kill(2) takes a 32-bit signed pid, and process.kill throws for a larger one (ERR_INVALID_ARG_TYPE,
  // not ESRCH): read as "may run", a lock naming one stayed held for ever. No process has such a pid.
  if (!Number.isSafeInteger(pid) || pid < 1 || pid > MAX_PID) return `pid ${pid} is past the highest pid a process can have`;
  const boot = currentBootId();
  if (identity !== undefined && boot !== undefined) {
    if (identity.bootId !== boot) return `pid ${pid} was written before this host last booted`;
    const now = processStartTime(pid);
    if (now !== undefined) return now === identity.startTime ? undefined : `pid ${pid} is now another process (started at another time)`;
  }
  try {
    process.kill(pid, 0);
    return undefined;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === "ESRCH" ? `pid ${pid} is not running` : undefined;
  }
}

/**
 * `<pid> <host> <start time> <boot id>`, the line naming a process in `collector.pid` and in a
 * take-over entry; `<pid> <host>` where /proc has no identity, and in files older collectors left.
 */
const PROCESS_LINE = /^([1-9][0-9]{0,9}) (\S{1,255})(?: (\S+) (\S+))?\n$/;

let ownLine: string | undefined;

/** This process's line (its identity does not change: read once). */
export function processLine(): string {
  if (ownLine === undefined) {
    const identity = processIdentity();
    ownLine = `${process.pid} ${hostname()}${identity ? ` ${identity.startTime} ${identity.bootId}` : ""}\n`;
  }
  return ownLine;
}

/**
 * Why the process a line names no longer runs; undefined while it may. `heldHere`: whether this
 * process holds what a line with our pid names (else an earlier process with our pid wrote it).
 */
export function whyProcessLineStale(line: string, heldHere: () => boolean): string | undefined {
  const m = PROCESS_LINE.exec(line);
  if (!m) return "unreadable content";
  const pid = Number(m[1]);
  const identity = m[3] === undefined ? undefined : parseProcessIdentity(m[3], m[4]!);
  if (m[3] !== undefined && identity === undefined) return "unreadable content";
  if (m[2] !== hostname()) return `left by host ${m[2]}, whose processes cannot be checked from here`;
  // Our pid: an earlier process's (pids are reused, e.g. in a requeued container), unless we hold it now.
  if (pid === process.pid) return heldHere() ? undefined : "left by this process";
  return whyOwnerGone(pid, identity);
}
