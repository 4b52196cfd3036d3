import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { Logger } from "pino";
import { Pool } from "undici";
import { z } from "zod";
import { AttemptSchema, CheckpointError, EpisodeIdSchema, MAX_JSON_DEPTH, ROLLOUT_PREFIX, bearerToken, decodeRequest, jsonNestsDeeperThan, parseRolloutPath, tokensEqual } from "../../protocol/index.js";
import { closeQueuedResponsesWithConnection } from "../http/queued-response-close.js";
import type { AdmissionTicket } from "../kinds/model/admission-ticket.js";
import { continuationHeader } from "../kinds/model/generation-cut-contract.js";
import { isGenerationRoute } from "../kinds/model/conversation-digest.js";
import { canonicalRoute, climbsAboveRoot } from "./canonical-route.js";
import { CodingWarnings } from "./coding-warnings.js";
import type { ModelKind } from "../kinds/model/model-kind.js";
import { ForwardedCall } from "./forwarded-call.js";
import { framingHeaders, namedRepresentationHeader, requestBodyCodings, upstreamHeaders, type RequestFraming } from "./hop-headers.js";
import { PassthroughCall } from "./passthrough-call.js";
import { proxiedLocation } from "./redirect-location.js";
import { decodedRequestBody } from "./request-body-coding.js";
import { json, refuse, refuseMalformedRequest, refuseUnknownExpectationsOn } from "./replies.js";
import type { Upstream } from "./upstream-url.js";

/**
 * The attach proxy: a streaming-safe reverse proxy that makes an OpenAI-compatible server we do
 * not own a model participant. `POST /ng-rollout/<capture_key>/v1/{chat/completions,responses,messages}`
 * gets an admission ticket and is forwarded with the `x-ng-*` lineage headers; the response start
 * is intercepted (held while admission is closed), then bytes are piped through with backpressure
 * — a stream is never buffered whole. Other routes pass through untracked.
 *
 * Framework-side ledger API (bearer auth with the control token):
 *   GET    /ng-capture/v1/ledger/<capture_key>   → {capture_key, records}
 *   DELETE /ng-capture/v1/ledger/<capture_key>   (refused while a checkpoint is open)
 *   POST   /ng-capture/v1/ledger/retire {rollout_id, attempt}  retires attempts 0..attempt
 *   GET    /ng-capture/v1/status                 → readiness counts and extras
 */
export interface AttachProxyOptions {
  upstream: Upstream;
  kind: ModelKind;
  controlToken: string;
  logger?: Logger;
  /** The largest generation request body read (default DEFAULT_MAX_BODY_BYTES): past it, `payload_too_large`. */
  maxBodyBytes?: number;
  /**
   * How long a recorded call's ended response may take to leave for its caller, and how long a
   * streaming answer (an untracked call's too) may wait for the caller's full socket to drain
   * (default 30 s): a caller that stopped reading would otherwise keep its ticket, a readiness
   * blocker, open for ever (an untracked call: its upstream connection). Also how long the rest of a
   * body refused `payload_too_large` may take to arrive (read and dropped) before its connection is closed.
   */
  finishWaitMs?: number;
}

/** The default body limit of a generation call: a long text conversation fits many times over. */
export const DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024;

const RetireBodySchema = z.object({ rollout_id: EpisodeIdSchema.shape.rollout_id, attempt: AttemptSchema }).strict();

export function createAttachProxy(options: AttachProxyOptions): Server {
  const { upstream, kind, logger } = options;
  const maxBody = options.maxBodyBytes ?? DEFAULT_MAX_BODY_BYTES;
  const finishWaitMs = options.finishWaitMs ?? 30_000;
  // undici's pool of keep-alive upstream connections (as many as there are concurrent calls, no Nagle;
  // TLS for an https upstream). Its dispatch API hands each chunk to the call's handler with no stream
  // objects in between. No timeouts: a generation may take as long as it takes, and a held response
  // waits for the checkpoint.
  const pool = new Pool(upstream.url.origin, { connections: null, headersTimeout: 0, bodyTimeout: 0 });
  const basePath = upstream.url.pathname.replace(/\/+$/, "");
  /** An upstream redirect to its own origin, onto the proxy behind the caller's rollout prefix (`prefix`, or ""). */
  const relocateFor = (prefix: string) => (location: string) => proxiedLocation(location, upstream.url, prefix);
  const warnings = new CodingWarnings(logger);

  // No requestTimeout (Node's is 300 s, fastify's servers run without one too): a caller's pipelined
  // request behind a held response stops being read once the answers queued behind it reach 16 KiB,
  // and one whose body was not all read would cut the connection, the held call with it, however
  // long the checkpoint lasts. headersTimeout (60 s) still guards a request's headers.
  // Without Host, Node would answer a bare 400; the upstream gets its own Host anyway.
  const server = createServer({ noDelay: true, keepAlive: true, requestTimeout: 0, requireHostHeader: false }, (req, res) => {
    handle(req, res).catch((error: unknown) => {
      // Closed admission refuses every call a checkpoint catches (the caller retries once it ends):
      // expected, so not a warning with a stack per call (thousands per run otherwise).
      if (error instanceof CheckpointError && error.code === "admission_closed") logger?.debug({ code: error.code, detail: error.message }, "attach proxy call refused: admission closed");
      else logger?.warn({ err: error }, "attach proxy request failed");
      if (!res.headersSent) refuse(res, error);
      else res.destroy();
    });
  });
  server.on("clientError", refuseMalformedRequest);
  refuseUnknownExpectationsOn(server);
  closeQueuedResponsesWithConnection(server);
  server.on("close", () => void pool.destroy().catch(() => undefined));

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    // A fragment is no part of a request target, yet Node's parser keeps one: it is dropped (an upstream
    // such as uvicorn's httptools parser reads the path before it), so `…/completions#x` is not untracked.
    const sent = req.url ?? "/";
    const hash = sent.indexOf("#");
    // An absolute-form target (`http://host/path`, which a client configured with a proxy sends) is read
    // by its path, as the upstream reads it: unreduced, `http://host/ng-capture/v1/…` went upstream with
    // the control token, and a prefixed generation call was refused as unprefixed.
    const rawUrl = originForm(hash === -1 ? sent : sent.slice(0, hash));
    if (rawUrl === undefined) throw new CheckpointError("invalid_request", `the request target must be a path or an absolute URL (got ${JSON.stringify(sent.slice(0, 100))})`);
    const q = rawUrl.indexOf("?");
    const path = q === -1 ? rawUrl : rawUrl.slice(0, q);
    const query = q === -1 ? "" : rawUrl.slice(q);
    if (path === "/health" && req.method === "GET") return json(res, 200, { ok: true, admission_open: kind.admissionOpen });
    if (path.startsWith("/ng-capture/v1/")) return ledgerApi(req, res, path);
    let rollout: ReturnType<typeof parseRolloutPath>;
    try {
      rollout = parseRolloutPath(path);
    } catch {
      rollout = "invalid";
    }
    if (rollout === "invalid") throw new CheckpointError("invalid_request", "the /ng-rollout/ prefix does not name a valid capture key");
    const route = rollout ? rollout.route : path;
    const relocate = relocateFor(rollout ? `${ROLLOUT_PREFIX}${encodeURIComponent(rollout.captureKey)}` : "");
    // A near miss of the ledger API (`//ng-capture/v1/…` from a base URL ending in `/`, another case,
    // another version) is refused, never forwarded: its request carries the control token.
    if (isLedgerSpelling(route)) throw new CheckpointError("not_found", `no ledger API route ${req.method} ${path.slice(0, 200)}: it is /ng-capture/v1/… exactly`);
    // Forwarded after the upstream's base path, a route climbing above its root would leave it once resolved.
    if (climbsAboveRoot(route)) throw new CheckpointError("invalid_request", `the path climbs above its root with ".." segments: ${path.slice(0, 200)}`);
    const framing = framingHeaders(req.rawHeaders);
    // Forwarded without it, the body would be read otherwise upstream than here (a proxy must drop what
    // Connection names): refused, so the upstream never reads bytes the proxy did not track as such.
    const representation = namedRepresentationHeader(framing);
    if (representation !== undefined) {
      throw new CheckpointError("invalid_request", `the Connection header names ${representation}, which says how the body is read: a proxy drops the headers Connection names (RFC 9110 §7.6.1), so the body would reach the upstream without it; leave it out of Connection`);
    }
    if (req.method !== "POST") return passthrough(req, res, framing, route + query, relocate);
    // Classified by what the upstream may read (decoded, dot segments resolved, ...), so no spelling of
    // a generation route goes through untracked (a doubled slash from a base URL ending in `/` is
    // common); it is forwarded as sent and recorded under its canonical form.
    const canonical = canonicalRoute(route);
    if (!isGenerationRoute(canonical)) return passthrough(req, res, framing, route + query, relocate);
    if (!rollout) throw new CheckpointError("rollout_id_required", "generation calls must use the /ng-rollout/<capture_key>/ prefix");
    const body = await readBody(req, maxBody, finishWaitMs);
    // A compressed body (a client that compresses its requests) is parsed decoded, and forwarded as it
    // came, its coding named unchanged: the upstream reads what the caller sent.
    const codings = requestBodyCodings(framing);
    const plain = codings === undefined ? body : await decodedRequestBody(body, codings, maxBody);
    let parsed: unknown;
    try {
      parsed = JSON.parse(plain.toString("utf8"));
    } catch {
      throw new CheckpointError("invalid_request", "the request body is not JSON");
    }
    if (!parsed || typeof parsed !== "object" || Array.isArray(parsed)) throw new CheckpointError("invalid_request", "the request body must be a JSON object");
    // The conversation digest (a cut round, a restored cut) walks the body as canonical JSON, which
    // refuses such nesting: refused here, before it is forwarded, rather than failing a checkpoint later.
    if (jsonNestsDeeperThan(parsed)) throw new CheckpointError("invalid_request", `the request body nests more than ${MAX_JSON_DEPTH} levels deep`);
    const ticket = await kind.admit(rollout.captureKey, canonical, parsed as Record<string, unknown>, rollout.episode);
    return forward(req, res, framing, route + query, body, ticket, relocate);
  }

  function passthrough(req: IncomingMessage, res: ServerResponse, framing: RequestFraming, route: string, relocate: (location: string) => string): void {
    const headers = upstreamHeaders(req.rawHeaders, framing, upstream.url.host);
    const length = req.headers["content-length"];
    if (length !== undefined) headers.push("content-length", length);
    // A body of unknown length goes on chunked (or with its length, if it had all arrived already).
    const body = (length !== undefined && length !== "0") || req.headers["transfer-encoding"] ? req : null;
    pool.dispatch({ path: basePath + route, method: req.method ?? "GET", headers, body }, new PassthroughCall(res, finishWaitMs, relocate, warnings));
  }

  function forward(req: IncomingMessage, res: ServerResponse, framing: RequestFraming, route: string, body: Buffer, ticket: AdmissionTicket, relocate: (location: string) => string): void {
    // The caller left while its call waited to be admitted (its ledger read, a checkpoint): nobody
    // reads the answer, so nothing is generated for it and no row is written.
    if (res.destroyed) return kind.fail(ticket);
    // Retired in the turns since its admission: refused like a call of a retired attempt, and never
    // sent upstream (its ForwardedCall would not hear an abort that already happened, so the call would
    // run to the upstream's answer, and the retire wait for it).
    if (ticket.abort.signal.aborted) {
      kind.fail(ticket);
      throw new CheckpointError("stale_attempt", `${ticket.captureKey} was retired`);
    }
    // Uncompressed: the usage is read from the answer's last bytes (the proxy sits next to the caller).
    const headers = upstreamHeaders(req.rawHeaders, framing, upstream.url.host, { identity: true });
    headers.push("x-ng-capture-key", ticket.captureKey, "x-ng-model-call-id", ticket.modelCallId);
    if (ticket.parentCallId) headers.push("x-ng-parent-call-id", ticket.parentCallId);
    if (ticket.claimedCut) {
      headers.push("x-ng-continued-from", ticket.claimedCut.model_call_id);
      headers.push("x-ng-continuation", continuationHeader(ticket.claimedCut.continuation));
    }
    pool.dispatch({ path: basePath + route, method: "POST", headers, body }, new ForwardedCall(res, ticket, kind, logger, finishWaitMs, relocate, warnings));
  }

  async function ledgerApi(req: IncomingMessage, res: ServerResponse, path: string): Promise<void> {
    const token = bearerToken(req.headers.authorization);
    if (token === undefined || !tokensEqual(token, options.controlToken)) throw new CheckpointError("unauthorized", "bad or missing bearer token");
    if (path === "/ng-capture/v1/status" && req.method === "GET") return json(res, 200, { ...kind.readiness(), ...kind.statusExtras() });
    if (path === "/ng-capture/v1/ledger/retire" && req.method === "POST") {
      // Decoded as a control message is: a key named twice (JSON.parse keeps the last) is refused, not retired on.
      const body = decodeRequest(RetireBodySchema, await readBody(req, 64 * 1024, finishWaitMs));
      return json(res, 200, { retired: await kind.retireLedgers(body) });
    }
    const prefix = "/ng-capture/v1/ledger/";
    if (path.startsWith(prefix)) {
      let key: string;
      try {
        key = decodeURIComponent(path.slice(prefix.length));
      } catch {
        throw new CheckpointError("invalid_request", `malformed percent-encoding in ${path}`);
      }
      if (req.method === "GET") return json(res, 200, await kind.captureManifest(key));
      if (req.method === "DELETE") {
        await kind.deleteLedger(key);
        return json(res, 200, { deleted: key });
      }
    }
    throw new CheckpointError("not_found", `no such capture route: ${req.method} ${path}`);
  }

  return server;
}

/**
 * A request target in origin-form (`/path?query`). An absolute-form one (`http://host/path?query`),
 * which a server must accept (RFC 9112 §3.2.2), is reduced to its path and query as sent (no
 * normalization: the path is classified, and forwarded, like any other); any other form (`*`) is
 * undefined, since the upstream hop can only carry a path.
 */
export function originForm(target: string): string | undefined {
  if (target.startsWith("/")) return target;
  const authority = /^[A-Za-z][A-Za-z0-9+.-]*:\/\/[^/?]*/.exec(target);
  if (!authority) return undefined;
  const rest = target.slice(authority[0].length);
  return rest.startsWith("/") ? rest : `/${rest}`;
}

/** How many times its limit a refused body may still send (read and dropped) before its connection is closed. */
const DRAINED_LIMITS = 4;

/**
 * The body of `req`, up to `limit` bytes; past it, refused `payload_too_large`, its rest read and
 * dropped for at most `drainMs` (and DRAINED_LIMITS times the limit) before its connection is closed.
 */
function readBody(req: IncomingMessage, limit: number, drainMs: number): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (chunk: Buffer) => {
      size += chunk.length;
      if (size <= limit) return void chunks.push(chunk);
      // Refused, but not by destroying the socket at once (a client still sending would get no answer):
      // the rest is read and dropped while the refusal is written, up to DRAINED_LIMITS times the
      // limit, so a client that sends its whole body before it reads the answer (httpx, so
      // openai-python) still gets the 413, and the connection stays usable. A client still sending
      // past that (a chunked body that never ends) has its connection closed: read for ever, it stayed busy.
      // So has one whose rest has not all come within `drainMs`: the server has no request timeout and
      // keep-alive's idle timer restarts with every byte, so a slow sender held the connection for ever.
      req.off("data", onData);
      chunks.length = 0;
      let dropped = size - limit;
      const close = () => {
        stopDraining();
        req.socket.destroy();
      };
      const drain = (more: Buffer) => {
        dropped += more.length;
        if (dropped > DRAINED_LIMITS * limit) close();
      };
      const timer = setTimeout(close, drainMs);
      const stopDraining = () => {
        clearTimeout(timer);
        req.off("data", drain);
        req.off("end", stopDraining);
        req.off("close", stopDraining);
      };
      req.on("data", drain);
      req.once("end", stopDraining);
      req.once("close", stopDraining);
      reject(new CheckpointError("payload_too_large", `request body larger than ${limit} bytes`));
    };
    req.on("data", onData);
    req.on("end", () => resolve(Buffer.concat(chunks)));
    req.on("error", reject);
  });
}

/** Whether `route` reads as the ledger API's prefix however it is spelled (decoded, case, slashes, dot segments). */
function isLedgerSpelling(route: string): boolean {
  let canonical: string;
  try {
    canonical = canonicalRoute(route);
  } catch {
    canonical = route.toLowerCase(); // malformed percent-encoding: judged as sent
  }
  return canonical === "/ng-capture" || canonical.startsWith("/ng-capture/");
}
