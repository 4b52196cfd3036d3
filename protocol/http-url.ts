import { redactNatsServers } from "./nats-connection.js";

/** Whether `value` is an absolute http:// or https:// URL (`localhost:8000` parses, as scheme `localhost:`, and is not). */
export function isHttpUrl(value: string): boolean {
  return URL.canParse(value) && /^https?:$/.test(new URL(value).protocol);
}

/**
 * A URL as a message or log line may show it: its userinfo (`user:pass@`) and its query and
 * fragment (`?code=…`, `?api_key=…`: keys some gateways take there) replaced by `[Redacted]`;
 * scheme, host, port and path kept, so a typo can still be read. Works on any text: a value refused
 * as a URL is shown through it too. The rules (and what an `@` or `?` that cannot be placed costs)
 * are those of NATS server lists, `redactNatsServers`.
 */
export function redactUrl(raw: string): string {
  return redactNatsServers(raw);
}
