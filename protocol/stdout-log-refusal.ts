import { writeSync } from "node:fs";
import { toCheckpointError } from "./errors.js";
import { isStorageFailure } from "./storage-failure.js";

/** What of a pino destination (sonic-boom) this touches. */
interface LogStream {
  on(event: "error", listener: (error: NodeJS.ErrnoException) => void): unknown;
}

/**
 * Makes a write that stdout refuses end a daemon's logs, the process going on: a terminal gone
 * (EIO: its window closed, an ssh session dropped) or a reader gone (EPIPE) silently, and a log file
 * the storage refuses (ENOSPC, EDQUOT, EFBIG, EIO, EROFS: `gym-ckpt coordinator > gym-ckpt.log` on
 * the disk that filled) with one line on stderr, opened by `notice`, saying so. pino's stream lets
 * only EPIPE pass and re-raises anything else as an unhandled 'error': a line logged during
 * `collect`'s hangup stop would crash it before its records are written; and on a full disk the
 * crash's exit would run pino's exit-time flushSync, which retries every error but EAGAIN for ever, so
 * the process would hang with its event loop blocked (its lease lapsing, SIGTERM ignored, never
 * restarted by a supervisor). The logs stay off until the process restarts. Used by the
 * coordinator's logger and every participant program's.
 */
export function endLogsWhenStdoutRefuses<S extends LogStream>(stream: S, notice = ""): S {
  let dropped = false;
  stream.on("error", (error) => {
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
      writeSync(2, `${notice}warning ${refusal.code}: ${refusal.message} (standard output): the logs that follow are dropped\n`);
    } catch {
      // stderr refuses too: nothing is left to say it on
    }
  });
  return stream;
}
