import type { IncomingHttpHeaders, OutgoingHttpHeaders } from "node:http";

/**
 * Headers that belong to one connection, not to the call: never copied across the proxy. `host` and
 * `content-length` are set for the upstream hop itself; `expect` is answered by our own server.
 * `proxy-authorization` / `proxy-authenticate` are the credentials and challenge of the hop to a proxy
 * (this one), never the upstream's business nor the caller's. Any header a `Connection` header names is
 * one too (RFC 9110 §7.6.1), dropped with it.
 */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authorization",
  "proxy-authenticate",
  "transfer-encoding",
  "te",
  "trailer",
  "upgrade",
  "host",
  "content-length",
  "expect",
]);

/**
 * The proxy's own control headers (`x-ng-*`) in any spelling of their separators: a WSGI/CGI upstream
 * reads `x_ng_capture_key` as `x-ng-capture-key` (both `HTTP_X_NG_CAPTURE_KEY`), so an underscore
 * spelling a caller sent would pass for, or override, the one the proxy sets.
 */
const CONTROL_HEADER = /^x[-_]ng[-_]/;

/** The header names `Connection` values list (comma-separated, any case): options of that connection only. */
function connectionOptions(values: readonly string[]): Set<string> {
  const names = new Set<string>();
  for (const value of values) {
    for (const token of value.split(",")) {
      const name = token.trim().toLowerCase();
      if (name) names.add(name);
    }
  }
  return names;
}

/**
 * The caller's headers for the upstream request, as a flat name/value list (undici's raw form):
 * read from `rawHeaders`, so the parsed `req.headers` object is never built on the hot path.
 * Caller-sent `x-ng-*` headers (also spelled with `_`) are dropped; the proxy sets its own. With `identity`, the answer is
 * asked for uncompressed (`accept-encoding: identity` instead of the caller's): the proxy reads a
 * tracked call's usage from its last bytes.
 */
export function upstreamHeaders(rawHeaders: string[], host: string, options: { identity?: boolean } = {}): string[] {
  const connection: string[] = [];
  for (let i = 0; i < rawHeaders.length; i += 2) if (rawHeaders[i]!.toLowerCase() === "connection") connection.push(rawHeaders[i + 1]!);
  const named = connectionOptions(connection);
  const out = ["host", host];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (HOP_BY_HOP.has(name) || named.has(name) || CONTROL_HEADER.test(name) || (options.identity && name === "accept-encoding")) continue;
    out.push(name, rawHeaders[i + 1]!);
  }
  if (options.identity) out.push("accept-encoding", "identity");
  return out;
}

/**
 * The upstream's response headers for the caller, hop-by-hop ones (and those its `Connection` names)
 * dropped; `content-length` kept, as the body is passed on as it came. `location` maps a `Location`
 * onto the proxy (`proxiedLocation`).
 */
export function callerHeaders(headers: IncomingHttpHeaders, location: (value: string) => string = (value) => value): OutgoingHttpHeaders {
  const connection = headers.connection;
  const named = connection === undefined ? new Set<string>() : connectionOptions(Array.isArray(connection) ? connection : [connection]);
  const out: OutgoingHttpHeaders = {};
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined || (name !== "content-length" && (HOP_BY_HOP.has(name) || named.has(name)))) continue;
    out[name] = name === "location" && typeof value === "string" ? location(value) : value;
  }
  return out;
}
