import type { IncomingHttpHeaders, OutgoingHttpHeaders } from "node:http";
import { CheckpointError } from "../../protocol/index.js";

/**
 * Headers that belong to one connection, not to the call: never copied across the proxy. `host` and
 * `content-length` are set for the upstream hop itself; `expect` is answered by our own server.
 * `proxy-authorization` / `proxy-authenticate` are the credentials and challenge of the hop to a proxy
 * (this one), never the upstream's business nor the caller's. Any header a `Connection` header names is
 * one too (RFC 9110 §7.6.1), dropped with it; a request or answer naming one that says how its body is
 * read is refused before this (`namedRepresentationHeader`, `answerRepresentationRefusal`).
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
 * The proxy's own control headers (`x-ng-*`), matched on a name's dashed spelling (`dashed`).
 */
const CONTROL_HEADER = /^x-ng-/;

/**
 * A header name with `_` read as `-`, as a WSGI/CGI upstream reads it: `x_ng_capture_key` and
 * `X-NG-Capture-Key` are both `HTTP_X_NG_CAPTURE_KEY`, `transfer_encoding` and `Transfer-Encoding` both
 * `HTTP_TRANSFER_ENCODING`. So a caller's underscore spelling of a header the proxy drops, sets or reads
 * the body by would pass for it (or override the proxy's): it is judged by this spelling.
 */
function dashed(name: string): string {
  return name.includes("_") ? name.replaceAll("_", "-") : name;
}

/** The header names `Connection` values list (comma-separated, any case), as `spell` spells them: options of that connection only. */
function connectionOptions(values: readonly string[], spell: (name: string) => string = (name) => name): Set<string> {
  const names = new Set<string>();
  for (const value of values) {
    for (const token of value.split(",")) {
      const name = token.trim().toLowerCase();
      if (name) names.add(spell(name));
    }
  }
  return names;
}

/** The codings `Transfer-Encoding` (or `Content-Encoding`) values list, in order, lower case; `identity` (see below) left out. */
function listedCodings(values: readonly string[]): string[] {
  const codings = [];
  for (const value of values) {
    for (const token of value.split(",")) {
      const coding = token.trim().toLowerCase();
      if (coding && coding !== "identity") codings.push(coding);
    }
  }
  return codings;
}

/** What a body's `Content-Encoding` becomes on the next hop (`nextHopCoding`). */
interface NextHopCoding {
  /**
   * `chunked` comes before another coding (`chunked, gzip`): such a body runs to the connection's
   * close and no parser removes its framing (RFC 9112 §6.3), so what it carries is no content coding
   * anyone could name: it goes on as it came, with no `Content-Encoding` at all (not even its own,
   * which lies under the framing).
   */
  unframed: boolean;
  /** The `Content-Encoding` to name instead of the body's own; undefined: its own, unchanged (the common case). */
  coded: string | undefined;
}

/**
 * A body's `Content-Encoding` on the next hop, from its `Transfer-Encoding` (`transfer`) and
 * `Content-Encoding` (`content`) values. Only the chunked framing belongs to the hop, and each hop's
 * parser removes it when it is the last coding (or absent); the body it hands over still carries the
 * others (`gzip, chunked` → `gzip`), so they travel on as content codings: listed after the
 * `Content-Encoding` ones, as they were applied after them. `identity` (RFC 2616's, which older
 * servers still send) is no coding at all: never named, as `Content-Encoding: identity` is no content
 * coding (RFC 9110 §8.4.1), and urllib3 decodes one listed with another (`identity, gzip`) as deflate.
 */
function nextHopCoding(transfer: readonly string[], content: readonly string[]): NextHopCoding {
  const codings = listedCodings(transfer);
  if (codings.slice(0, -1).includes("chunked")) return { unframed: true, coded: undefined };
  const others = codings.filter((coding) => coding !== "chunked");
  if (others.length === 0) return { unframed: false, coded: undefined };
  return { unframed: false, coded: [...content.map((value) => value.trim()).filter((value) => value), ...others].join(", ") };
}

/**
 * The codings an answer's body carries once the hop has removed its chunked framing: its
 * `Content-Encoding`'s, then its `Transfer-Encoding`'s others (`identity` none of them), comma-separated
 * in the order applied; undefined when there are none.
 */
export function bodyCodings(headers: IncomingHttpHeaders): string | undefined {
  if (headers["content-encoding"] === undefined && headers["transfer-encoding"] === undefined) return undefined; // every call reads it
  return codingsOf(values(headers["content-encoding"]), values(headers["transfer-encoding"]));
}

/** The values of a request's `Connection`, `Transfer-Encoding` and `Content-Encoding` headers. */
export interface RequestFraming {
  connection: string[];
  transfer: string[];
  content: string[];
}

/**
 * A request's `RequestFraming`, read from its `rawHeaders` (the parsed `req.headers` is never built on
 * the hot path): read once per call, then handed to each function below that needs it.
 */
export function framingHeaders(rawHeaders: string[]): RequestFraming {
  const found: RequestFraming = { connection: [], transfer: [], content: [] };
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    if (name === "connection") found.connection.push(rawHeaders[i + 1]!);
    else if (name === "transfer-encoding") found.transfer.push(rawHeaders[i + 1]!);
    else if (name === "content-encoding") found.content.push(rawHeaders[i + 1]!);
  }
  return found;
}

/** `bodyCodings` of a request, from its framing headers. */
export function requestBodyCodings({ content, transfer }: RequestFraming): string | undefined {
  return content.length === 0 && transfer.length === 0 ? undefined : codingsOf(content, transfer);
}

/**
 * The headers that say how a body is read. Named by a `Connection` header they would be dropped as
 * options of that connection (RFC 9110 §7.6.1) while the body goes on as it came, so the far side
 * would misread it: the upstream, other bytes than the proxy decoded and tracked (gzip taken for
 * JSON); the caller, gzip bytes with no coding named.
 */
const REPRESENTATION_HEADERS: Record<string, string> = { "content-encoding": "Content-Encoding", "content-type": "Content-Type" };

/** The first of `names` that is a `REPRESENTATION_HEADERS` one, as it is usually spelled; undefined when none is. */
function representationHeaderIn(names: Set<string>): string | undefined {
  for (const name of names) if (Object.hasOwn(REPRESENTATION_HEADERS, name)) return REPRESENTATION_HEADERS[name];
  return undefined;
}

/**
 * The first header describing the body (`REPRESENTATION_HEADERS`) that the request's `Connection`
 * names (in any spelling the proxy drops it by), as it is usually spelled; undefined when none is.
 */
export function namedRepresentationHeader({ connection }: RequestFraming): string | undefined {
  return connection.length === 0 ? undefined : representationHeaderIn(connectionOptions(connection, dashed));
}

/**
 * The refusal of an upstream answer whose `Connection` names a header describing its body (as
 * `callerHeaders` spells what it drops): `upstream_failed` naming it, answered 502 before any of the
 * answer leaves; undefined when none is named.
 */
export function answerRepresentationRefusal(headers: IncomingHttpHeaders): CheckpointError | undefined {
  const connection = headers.connection;
  const header = connection === undefined ? undefined : representationHeaderIn(connectionOptions(values(connection)));
  if (header === undefined) return undefined;
  return new CheckpointError(
    "upstream_failed",
    `upstream: the answer's Connection header names ${header}, which says how the body is read: a proxy drops the headers Connection names (RFC 9110 §7.6.1), so the body would reach the caller without it`,
  );
}

function codingsOf(content: readonly string[], transfer: readonly string[]): string | undefined {
  const codings = [...listedCodings(content), ...listedCodings(transfer).filter((coding) => coding !== "chunked")];
  return codings.length === 0 ? undefined : codings.join(", ");
}

/** A header's values (none, one or several), as a list. */
function values(value: string | string[] | undefined): string[] {
  return value === undefined ? [] : Array.isArray(value) ? value : [value];
}

/**
 * The caller's headers for the upstream request, as a flat name/value list (undici's raw form):
 * read from `rawHeaders` and their `framing` (`framingHeaders`), so the parsed `req.headers` object is
 * never built on the hot path.
 * Caller-sent `x-ng-*` headers are dropped (the proxy sets its own), and every header is judged by its
 * dashed spelling (`dashed`): `transfer_encoding`, `content_length`, `x_ng_capture_key` go the way of
 * the dashed ones, and `content_encoding` is dropped. With `identity`, the answer is
 * asked for uncompressed (`accept-encoding: identity` instead of the caller's): the proxy reads a
 * tracked call's usage from its last bytes. A body's transfer codings other than `chunked` are named
 * in its `Content-Encoding` (undici frames the upstream hop itself and takes no `Transfer-Encoding`).
 */
export function upstreamHeaders(rawHeaders: string[], { connection, transfer, content }: RequestFraming, host: string, options: { identity?: boolean } = {}): string[] {
  const named = connectionOptions(connection, dashed);
  // (Node's server refuses a request whose framing is not its last coding: `unframed` is for answers.)
  const { unframed, coded } = nextHopCoding(transfer, content);
  const out = ["host", host];
  for (let i = 0; i < rawHeaders.length; i += 2) {
    const name = rawHeaders[i]!.toLowerCase();
    const read = dashed(name);
    if (HOP_BY_HOP.has(read) || named.has(read) || CONTROL_HEADER.test(read) || (options.identity && read === "accept-encoding")) continue;
    // The body's coding is the dashed header's (the proxy decodes a generation body by it, and may rename it).
    if (read === "content-encoding" && (name !== read || unframed || coded !== undefined)) continue;
    out.push(name, rawHeaders[i + 1]!);
  }
  if (coded !== undefined) out.push("content-encoding", coded);
  if (options.identity) out.push("accept-encoding", "identity");
  return out;
}

/**
 * The upstream's response headers for the caller, hop-by-hop ones (and those its `Connection` names)
 * dropped; `content-length` kept, as the body is passed on as it came. Transfer codings other than
 * `chunked` are named in `Content-Encoding`, as for a request; an answer whose `chunked` is not its
 * last coding names none (`NextHopCoding.unframed`), and `onUnframed` hears its `Transfer-Encoding`.
 * `location` maps a `Location` onto the proxy (`proxiedLocation`). An answer whose `Connection` names a
 * header describing its body is refused before this (`answerRepresentationRefusal`).
 */
export function callerHeaders(
  headers: IncomingHttpHeaders,
  location: (value: string) => string = (value) => value,
  onUnframed?: (transferEncoding: string) => void,
): OutgoingHttpHeaders {
  const connection = headers.connection;
  const named = connection === undefined ? new Set<string>() : connectionOptions(values(connection));
  const transfer = headers["transfer-encoding"];
  const { unframed, coded } = transfer === undefined ? { unframed: false, coded: undefined } : nextHopCoding(values(transfer), values(headers["content-encoding"]));
  if (unframed) onUnframed?.(values(transfer).join(", "));
  const out: OutgoingHttpHeaders = {};
  for (const name in headers) {
    const value = headers[name];
    if (value === undefined || (name !== "content-length" && (HOP_BY_HOP.has(name) || named.has(name)))) continue;
    if (unframed && name === "content-encoding") continue;
    out[name] = name === "location" && typeof value === "string" ? location(value) : value;
  }
  if (coded !== undefined) out["content-encoding"] = coded;
  return out;
}
