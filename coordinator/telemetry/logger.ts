import { writeSync } from "node:fs";
import { trace } from "@opentelemetry/api";
import { pino, type DestinationStream, type Logger, type LevelWithSilent } from "pino";
import { LOG_REDACT_CENSOR, LOG_REDACT_PATHS, isStorageFailure, loggedError, toCheckpointError } from "../../protocol/index.js";

/** Paths pino censors: the shared list of protocol/log-redaction.ts (tokens, passwords, credential headers). */
export const REDACT_PATHS = LOG_REDACT_PATHS;

/** The levels a `--log-level` flag or `log_level` setting may name. */
export const LOG_LEVELS = ["fatal", "error", "warn", "info", "debug", "trace", "silent"] as const satisfies readonly LevelWithSilent[];

/** JSON logs with trace correlation (trace_id/span_id from the active span), redaction and bounded errors (loggedError). */
export function createLogger(level: LevelWithSilent = "info", destination?: DestinationStream): Logger {
  return pino(
    {
      name: "gym-ckpt",
      level,
      redact: { paths: [...LOG_REDACT_PATHS], censor: LOG_REDACT_CENSOR },
      serializers: { err: (err: unknown) => loggedError(err, pino.stdSerializers.err) },
      base: { pid: process.pid },
      mixin() {
        const context = trace.getActiveSpan()?.spanContext();
        return context && trace.isSpanContextValid(context) ? { trace_id: context.traceId, span_id: context.spanId } : {};
      },
    },
    destination ?? stdoutDestination(),
  );
}

/**
 * stdout as pino's own default writes it, except that a write stdout refuses ends the logs, the
 * process going on: a terminal gone (EIO: its window closed, an ssh session dropped) or a reader
 * gone (EPIPE) silently, and a log file the storage refuses (ENOSPC, EDQUOT, EFBIG, EIO, EROFS:
 * `gym-ckpt coordinator > /var/log/gym-ckpt.log` on the disk that filled) with one line on stderr
 * saying so. pino's stream lets only EPIPE pass and re-raises anything else as an unhandled
 * 'error': a line logged during `collect`'s hangup stop crashed it before its records were written
 * and collector.pid removed; and on a full disk the crash's exit ran pino's exit-time flushSync,
 * which retries every error but EAGAIN for ever, so the process hung there with its event loop
 * blocked (its lease lapsing, SIGTERM ignored, never restarted by a supervisor). The logs stay
 * off until the process restarts.
 */
function stdoutDestination(): DestinationStream {
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
      writeSync(2, `warning ${refusal.code}: ${refusal.message} (standard output): the logs that follow are dropped\n`);
    } catch {
      // stderr refuses too: nothing is left to say it on
    }
  };
  stream.on("error", dropRest);
  return stream;
}
