import { pino, type Logger } from "pino";
import { LOG_REDACT_CENSOR, LOG_REDACT_PATHS, loggedError } from "../../protocol/index.js";
import { traceLogFields } from "../telemetry/log-correlation.js";

let fallback: Logger | undefined;

/**
 * The logger used when the caller passes none (created lazily so importing the library stays
 * quiet): the same redaction and trace correlation as the servers' loggers.
 */
export function defaultLogger(): Logger {
  fallback ??= pino({
    name: "gym-ckpt.replay",
    level: process.env["LOG_LEVEL"] ?? "info",
    redact: { paths: [...LOG_REDACT_PATHS], censor: LOG_REDACT_CENSOR },
    serializers: { err: (err: unknown) => loggedError(err, pino.stdSerializers.err) },
    mixin: traceLogFields,
  });
  return fallback;
}
