import { trace } from "@opentelemetry/api";
import { pino, type DestinationStream, type Logger, type LevelWithSilent } from "pino";
import { LOG_REDACT_CENSOR, LOG_REDACT_PATHS, endLogsWhenStdoutRefuses, loggedError } from "../../protocol/index.js";

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

/** stdout as pino's own default writes it, but a write it refuses ends the logs, not the process (protocol/stdout-log-refusal.ts). */
function stdoutDestination(): DestinationStream {
  return endLogsWhenStdoutRefuses(pino.destination({ dest: process.stdout.fd || 1 }));
}
