import { readFileSync, readdirSync } from "node:fs";
import { processStartTime } from "../../protocol/process-identity.js";

/** Linux /proc helpers for tests that check no process is left behind. */

function stat(pid: number): { ppid: number; state: string } | undefined {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, "utf8");
    // The command name may hold spaces and parentheses: fields start after the last ")".
    const fields = text.slice(text.lastIndexOf(")") + 2).split(" ");
    return { state: fields[0]!, ppid: Number(fields[1]) };
  } catch {
    return undefined;
  }
}

/** Alive and not a zombie (a zombie only waits for its parent to reap it). */
export function alive(pid: number): boolean {
  const s = stat(pid);
  return s !== undefined && s.state !== "Z";
}

/** Every live descendant of `root`, with its command line. */
export function descendants(root: number): { pid: number; cmdline: string }[] {
  const children = new Map<number, number[]>();
  for (const entry of readdirSync("/proc")) {
    const pid = Number(entry);
    if (!Number.isInteger(pid)) continue;
    const s = stat(pid);
    if (!s || s.state === "Z") continue;
    children.set(s.ppid, [...(children.get(s.ppid) ?? []), pid]);
  }
  const found: { pid: number; cmdline: string }[] = [];
  const queue = [...(children.get(root) ?? [])];
  while (queue.length > 0) {
    const pid = queue.shift()!;
    let cmdline = "";
    try {
      cmdline = readFileSync(`/proc/${pid}/cmdline`, "utf8").replaceAll("\0", " ");
    } catch {
      continue;
    }
    found.push({ pid, cmdline });
    queue.push(...(children.get(pid) ?? []));
  }
  return found;
}

/**
 * Pids a test started, each with its start time. pid_max is often 32768 and the suite starts
 * thousands of processes, so by teardown a pid may name another process (a vitest worker, the CI
 * shell): `killAll` kills only the processes recorded here, never a later one with the same pid.
 */
export class TrackedProcesses extends Set<number> {
  private started: Map<number, string> | undefined;

  override add(pid: number): this {
    const started = processStartTime(pid);
    if (started !== undefined) (this.started ??= new Map()).set(pid, started);
    return super.add(pid);
  }

  /** Still the process that was added (not exited, its pid not reused). */
  isSame(pid: number): boolean {
    const started = this.started?.get(pid);
    return started !== undefined && processStartTime(pid) === started;
  }
}

/** SIGKILL every tracked process still running, skipping those gone (or whose pid now names another): for test teardown. */
export function killAll(pids: TrackedProcesses): void {
  for (const pid of pids) {
    if (!pids.isSame(pid)) continue;
    try {
      process.kill(pid, "SIGKILL");
    } catch {
      // gone meanwhile
    }
  }
}
