import { trace } from "@opentelemetry/api";
import { pino, type DestinationStream, type Logger, type LevelWithSilent } from "pino";

/** Paths pino censors: tokens, credentials and Authorization headers wherever they appear. */
export const REDACT_PATHS = [
  "token",
  "controller_token",
  "*.token",
  "*.controller_token",
  "*.pass",
  "nats.pass",
  "config.token",
  "config.controller_token",
  "config.nats.pass",
  "config.nats.token",
  "authorization",
  "Authorization",
  "*.authorization",
  "*.Authorization",
  "headers.authorization",
  "*.headers.authorization",
];

/** JSON logs with trace correlation (trace_id/span_id from the active span) and redaction. */
export function createLogger(level: LevelWithSilent = "info", destination?: DestinationStream): Logger {
  return pino(
    {
      name: "gym-ckpt",
      level,
      redact: { paths: REDACT_PATHS, censor: "[Redacted]" },
      base: { pid: process.pid },
      mixin() {
        const context = trace.getActiveSpan()?.spanContext();
        return context && trace.isSpanContextValid(context) ? { trace_id: context.traceId, span_id: context.spanId } : {};
      },
    },
    destination,
  );
}
