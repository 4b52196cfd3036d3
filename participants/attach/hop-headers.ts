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
 * The codings a `Transfer-Encoding` lists besides `chunked` (`gzip, chunked` → `["gzip"]`). Only the
 * chunked framing belongs to the hop, and each hop's parser removes it; the body it hands over still
 * carries the others, so they travel on as content codings: listed after the `Content-Encoding` ones
 * (`content`), as they were applied after them. Undefined when there are none (the common case).
 * `identity` (RFC 2616's, which older servers still send) is no coding at all: never named, as
 * `Content-Encoding: identity` is no content coding (RFC 9110 §8.4.1), and urllib3 decodes one listed
 * with another (`identity, gzip`) as deflate.
 */
function contentCodings(transfer: readonly string[], content: readonly string[]): string | undefined {
  const codings = [];
  for (const value of transfer) {
    for (const token of value.split(",")) {
      const coding = token.trim().toLowerCase();
      if (coding && coding !== "chunked" && coding !== "identity") codings.push(coding);
    }
  }
  if (codings.length === 0) return undefined;
  return [...content.map((value) => value.trim()).filter((value) => value), ...codings].join(", ");
}

/** A header's values (none, one or several), as a list. */
function values(value: string | string[] | undefined): string[] {
  return value === undefined ? [] : Array.isArray(value) ? value : [value];
}

/**
 * The caller's headers for the upstream request, as a flat name/value list (undici's raw form):
 * read from `rawHeaders`, so the parsed `req.headers` object is never built on the hot path.
 * Caller-sent `x-ng-*` headers (also spelled with `_`) are dropped; the proxy sets its own. With `identity`, the answer is
 * asked for uncompressed (`accept-encoding: identity` instead of the caller's): the proxy reads a
 * tracked call's usage from its last bytes. A body's transfer codings other than `chunked` are named
 * in its `Content-Encoding` (undici frames the upstream hop itself and takes no `Transfer-Encoding`).
 */
export function upstreamHeaders(rawHeaders: string[], host: string, options: { identity?: boolean } = {}): string[] {
  const connection: string[] = [];
  const transfer: string[] = [];
  const content: string[] = [];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (name === "connection") connection.push(rawHeaders[i + 1]!);
    else if (name === "transfer-encoding") transfer.push(rawHeaders[i + 1]!);
    else if (name === "content-encoding") content.push(rawHeaders[i + 1]!);
  }
  const named = connectionOptions(connection);
  const coded = transfer.length === 0 ? undefined : contentCodings(transfer, content);
  const out = ["host", host];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (HOP_BY_HOP.has(name) || named.has(name) || CONTROL_HEADER.test(name) || (options.identity && name === "accept-encoding")) continue;
    if (coded !== undefined && name === "content-encoding") continue;
    out.push(name, rawHeaders[i + 1]!);
  }
  if (coded !== undefined) out.push("content-encoding", coded);
  if (options.identity) out.push("accept-encoding", "identity");
  return out;
}

/**
 * The upstream's response headers for the caller, hop-by-hop ones (and those its `Connection` names)
 * dropped; `content-length` kept, as the body is passed on as it came. Transfer codings other than
 * `chunked` are named in `Content-Encoding`, as for a request. `location` maps a `Location` onto the
 * proxy (`proxiedLocation`).
 */
export function callerHeaders(headers: IncomingHttpHeaders, location: (value: string) => string = (value) => value): OutgoingHttpHeaders {
  const connection = headers.connection;
  const named = connection === undefined ? new Set<string>() : connectionOptions(values(connection));
  const transfer = headers["transfer-encoding"];
  const coded = transfer === undefined ? undefined : contentCodings(values(transfer), values(headers["content-encoding"]));
  const out: OutgoingHttpHeaders = {};
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined || (name !== "content-length" && (HOP_BY_HOP.has(name) || named.has(name)))) continue;
    out[name] = name === "location" && typeof value === "string" ? location(value) : value;
  }
  if (coded !== undefined) out["content-encoding"] = coded;
  return out;
}
