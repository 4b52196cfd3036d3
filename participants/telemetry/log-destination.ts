import { writeSync } from "node:fs";
import { pino, type DestinationStream } from "pino";
import { isStorageFailure, toCheckpointError } from "../../protocol/index.js";

/**
 * stdout for a participant program's pino logs (`name` opens its notice), as pino's own default
 * writes it, except that a write stdout refuses ends the logs, the process going on: a reader gone
 * (EPIPE) or a terminal gone (EIO) silently, and a log file the storage refuses (ENOSPC, EDQUOT,
 * EFBIG, EIO, EROFS: `gym-ckpt gym > gym.log` on the disk that filled) with one line on stderr
 * saying so. pino's stream re-raises anything but EPIPE as an unhandled 'error', and on a full
 * disk the crash's exit ran pino's exit-time flushSync, which retries every error but EAGAIN for
 * ever: the server hung there with its event loop blocked (its heartbeats and every request
 * unanswered, SIGTERM ignored, never restarted by a supervisor). The logs stay off until the
 * process restarts. The coordinator's logger does the same (coordinator/telemetry/logger.ts).
 */
export function stdoutLogDestination(name: string): DestinationStream {
  const stream = pino.destination({ dest: process.stdout.fd || 1 });
  let dropped = false;
  const dropRest = (error: NodeJS.ErrnoException): void => {
    const gone = error.code === "EPIPE" || error.code === "EIO";
    if (!gone && !isStorageFailure(error)) throw error;
    // A write already in flight may fail after the first: said once.
    if (dropped) return;
    dropped = true;
    // What pino does for EPIPE: the stream's user (pino) has no way to be told to stop.
    const ignore = (): boolean => true;
    Object.assign(stream, { write: ignore, end: ignore, flushSync: ignore, destroy: ignore });
    if (gone) return;
    try {
      // Straight to the descriptor: stderr may be the same full file, and its stream would raise again.
      const refusal = toCheckpointError(error);
      writeSync(2, `${name}: warning ${refusal.code}: ${refusal.message} (standard output): the logs that follow are dropped\n`);
    } catch {
      // stderr refuses too: nothing is left to say it on
    }
  };
  stream.on("error", dropRest);
  return stream;
}
