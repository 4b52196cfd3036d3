import { pino, type Logger } from "pino";

let fallback: Logger | undefined;

/** The logger used when the caller passes none (created lazily so importing the library stays quiet). */
export function defaultLogger(): Logger {
  fallback ??= pino({ name: "gym-ckpt.replay", level: process.env["LOG_LEVEL"] ?? "info" });
  return fallback;
}
