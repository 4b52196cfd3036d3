import { processStartTime } from "../../protocol/process-identity.js";

/**
 * A process group this process started (a detached child, whose pid is the group's id), signalled
 * only while that id still names it. Once a group is empty Linux may give its number to a new
 * process; a late `kill(-id)` (a teardown, a kill after the leader exited) would then reach an
 * unrelated group, which itself started detached — in CI, another test's nats-server. While any
 * member of ours lives, the number stays reserved; the leader's start time, read at spawn, tells
 * our leader from a later process with its pid.
 */
export class ProcessGroup {
  constructor(
    readonly id: number,
    private readonly leaderStart: string | undefined = processStartTime(id),
  ) {}

  /** Sends `signal` to every member; false when the group is gone or its id now names another process. */
  signal(signal: NodeJS.Signals): boolean {
    const now = processStartTime(this.id);
    if (this.leaderStart !== undefined && now !== undefined && now !== this.leaderStart) return false;
    try {
      process.kill(-this.id, signal);
      return true;
    } catch {
      return false; // no such group (ESRCH): every member has exited
    }
  }
}
