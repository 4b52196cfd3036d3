/**
 * Keys whose values are credentials wherever they appear in a log line: control and controller
 * tokens (config, flags, `extra["cut-token"]` of the reference servers), NATS passwords, the judge's
 * API key, HTTP credential headers (in either spelling) and the resources session cookie.
 */
const SECRET_KEYS = [
  "token",
  "controller_token",
  "controlToken",
  "cutToken",
  "cut-token",
  "pass",
  "password",
  "apiKey",
  "api_key",
  // Header names as Node reports them (lower case) and as a caller may spell them.
  "authorization",
  "Authorization",
  "proxy-authorization",
  "Proxy-Authorization",
  "cookie",
  "Cookie",
  "set-cookie",
  "Set-Cookie",
  "x-api-key",
  "X-Api-Key",
] as const;

/** pino's `*` matches exactly one level: a key is censored at the top and two levels down (`config.nats.pass`). */
const DEPTHS = [0, 1, 2] as const;

function redactPath(depth: number, key: string): string {
  const prefix = Array<string>(depth).fill("*").join(".");
  if (/^[A-Za-z_$][\w$]*$/.test(key)) return prefix ? `${prefix}.${key}` : key;
  return `${prefix}["${key}"]`;
}

/**
 * The one redact path list of every pino logger (coordinator, reference servers, replay). HTTP
 * client errors carry their request config (headers included) under `err.config`: all of it goes.
 */
export const LOG_REDACT_PATHS: readonly string[] = Object.freeze([...DEPTHS.flatMap((depth) => SECRET_KEYS.map((key) => redactPath(depth, key))), "err.config.*"]);

/** The censor that replaces each redacted value. */
export const LOG_REDACT_CENSOR = "[Redacted]";
