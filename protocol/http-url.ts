import { redactNatsServers } from "./nats-connection.js";

/** Whether `value` is an absolute http:// or https:// URL (`localhost:8000` parses, as scheme `localhost:`, and is not). */
export function isHttpUrl(value: string): boolean {
  return URL.canParse(value) && /^https?:$/.test(new URL(value).protocol);
}

/**
 * A URL as a message or log line may show it: its userinfo (`user:pass@`, redacted as for NATS
 * URLs, whatever the text parses as) and its query and fragment (`?code=…`, `?api_key=…`: keys some
 * gateways take there) replaced by `[Redacted]`; scheme, host, port and path kept, so a typo can
 * still be read. Works on any text: a value refused as a URL is shown through it too.
 *
 * A `?` or `#` before the last `@` cannot be told from the text: a password holding it, or a query
 * holding an `@` (`?user=a@b.example&key=…`) that runs on past it. Then nothing but the scheme is
 * kept: the part after that `@` may be the rest of the query.
 */
export function redactUrl(raw: string): string {
  const text = redactNatsServers(raw);
  const lastAt = raw.lastIndexOf("@");
  if (lastAt >= 0 && /[?#]/.test(raw.slice(0, lastAt))) return text.slice(0, text.length - (raw.length - lastAt));
  const rest = text.search(/[?#]/);
  return rest < 0 ? text : `${text.slice(0, rest)}${text[rest]}[Redacted]`;
}
