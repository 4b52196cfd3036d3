import { pino, type Logger, type LevelWithSilent } from "pino";
import { LOG_REDACT_CENSOR, LOG_REDACT_PATHS, envSetting, loggedError } from "../../protocol/index.js";
import { traceLogFields } from "../telemetry/log-correlation.js";

let fallback: Logger | undefined;

/**
 * The logger used when the caller passes none (created lazily so importing the library stays
 * quiet): the same redaction and trace correlation as the servers' loggers.
 */
export function defaultLogger(): Logger {
  fallback ??= pino({
    name: "gym-ckpt.replay",
    level: fallbackLevel(),
    redact: { paths: [...LOG_REDACT_PATHS], censor: LOG_REDACT_CENSOR },
    serializers: { err: (err: unknown) => loggedError(err, pino.stdSerializers.err) },
    mixin: traceLogFields,
  });
  return fallback;
}

/**
 * LOG_LEVEL when it names a pino level (any case; Python's `warning` is warn), else info. Other
 * programs read the variable too: a value pino does not know (`warning`, an empty `LOG_LEVEL=`)
 * made pino throw, and with it the ReplayTaskSource or readRecords that asked for this logger.
 */
function fallbackLevel(): LevelWithSilent {
  const named = envSetting("LOG_LEVEL")?.trim().toLowerCase();
  const level = named === "warning" ? "warn" : named;
  return level !== undefined && (level === "silent" || Object.hasOwn(pino.levels.values, level)) ? (level as LevelWithSilent) : "info";
}
