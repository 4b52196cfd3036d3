/**
 * Ends the process by SIGHUP itself, once stopped for one, as the signal's default action would:
 * whoever started it sees a hangup, and Node 20 aborts (SIGABRT, a core dump) in an ordinary exit
 * once its terminal is gone, its restore of the terminal's settings failing with EIO
 * (nodejs/node#51519). Shared by the coordinator daemon, the Gym launcher and its servers.
 */
export function dieByHangup(): void {
  process.removeAllListeners("SIGHUP");
  process.kill(process.pid, "SIGHUP");
}
