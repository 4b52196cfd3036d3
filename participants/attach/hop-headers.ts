import type { IncomingHttpHeaders, OutgoingHttpHeaders } from "node:http";

/**
 * Headers that belong to one connection, not to the call: never copied across the proxy. `host` and
 * `content-length` are set for the upstream hop itself; `expect` is answered by our own server.
 */
const HOP_BY_HOP = new Set(["connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade", "host", "content-length", "expect"]);

/**
 * The caller's headers for the upstream request, as a flat name/value list (undici's raw form):
 * read from `rawHeaders`, so the parsed `req.headers` object is never built on the hot path.
 * Caller-sent `x-ng-*` headers are dropped; the proxy sets its own. With `identity`, the answer is
 * asked for uncompressed (`accept-encoding: identity` instead of the caller's): the proxy reads a
 * tracked call's usage from its last bytes.
 */
export function upstreamHeaders(rawHeaders: string[], host: string, options: { identity?: boolean } = {}): string[] {
  const out = ["host", host];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (HOP_BY_HOP.has(name) || name.startsWith("x-ng-") || (options.identity && name === "accept-encoding")) continue;
    out.push(name, rawHeaders[i + 1]!);
  }
  if (options.identity) out.push("accept-encoding", "identity");
  return out;
}

/** The upstream's response headers for the caller, hop-by-hop ones dropped (content-length kept). */
export function callerHeaders(headers: IncomingHttpHeaders): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined || (HOP_BY_HOP.has(name) && name !== "content-length")) continue;
    out[name] = value;
  }
  return out;
}
