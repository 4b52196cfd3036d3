import { CheckpointError, ErrorReplySchema } from "../../../protocol/index.js";
import { readCappedText } from "../../../protocol/capped-body.js";
import { UNTIMED_FETCH_DISPATCHER } from "../../../protocol/untimed-dispatcher.js";

/**
 * The small HTTP client the reference servers use for their data-plane calls. A refusal with the
 * standard error body becomes the same CheckpointError on this side, so `admission_closed` and
 * `stale_attempt` travel unchanged from callee to caller.
 */
export interface JsonResponse {
  status: number;
  headers: Headers;
  body: unknown;
}

/**
 * The largest reply body a data-plane call reads (`payload_too_large` past it, the rest cancelled):
 * a reply may carry a whole trajectory (an agent's `/run`), tens of MiB, but a callee answering
 * with an endless body must not grow the caller without bound.
 */
export const MAX_GYM_REPLY_BYTES = 64 * 1024 * 1024;

/**
 * No 300 s limit of fetch's own (UNTIMED_FETCH_DISPATCHER): an agent's `activate` spans its whole
 * turn loop and any call may wait through a checkpoint (a policy response the model holds, a
 * resources request waiting for resume). The caller's signal is the only bound: the episode
 * deadline (`--episode-timeout-ms`, pauses not counted), a retire, or a call's own timeout such as
 * close_session's.
 */
export async function postJson(url: string, body: unknown, options: { signal?: AbortSignal; headers?: Record<string, string> } = {}): Promise<JsonResponse> {
  // fetch gets a signal of this call's own: the abort listener it adds to a signal goes only when
  // its request is garbage collected, so an episode's signal would hold one per call made with it.
  const { signal } = options;
  const call = signal && new AbortController();
  const onAbort = () => call?.abort(signal?.reason);
  if (signal?.aborted) onAbort();
  else signal?.addEventListener("abort", onAbort, { once: true });
  let text: string;
  let response: Response;
  try {
    response = await fetch(url, {
      method: "POST",
      headers: { "content-type": "application/json", ...options.headers },
      body: JSON.stringify(body),
      ...(call && { signal: call.signal }),
      dispatcher: UNTIMED_FETCH_DISPATCHER, // with the global fetch, which tests stub
    });
    text = await readCappedText(response, MAX_GYM_REPLY_BYTES, `${new URL(url).pathname} reply`);
  } catch (error) {
    throw connectionFailed(error, url, signal) ?? error;
  } finally {
    signal?.removeEventListener("abort", onAbort);
  }
  let parsed: unknown = undefined;
  try {
    parsed = text.length ? JSON.parse(text) : undefined;
  } catch {
    parsed = text;
  }
  return { status: response.status, headers: response.headers, body: parsed };
}

/** Errno codes (ECONNREFUSED, ECONNRESET, EAI_AGAIN, ...), not Node's ERR_* ones, and undici's socket failures. */
const CONNECTION_FAILURE = /^(E[A-Z]+|EAI_[A-Z]+|UND_ERR_SOCKET|UND_ERR_CONNECT_TIMEOUT)$/;

/**
 * fetch's network error (a TypeError with its cause: refused, reset, or cut before the reply was
 * complete) as the callee's failure, `upstream_failed`, which a caller may send again: the model
 * proxy cuts a call whose capture-ledger row it could not write. Not a call the caller aborted
 * itself, nor a call fetch refused to make (a URL that does not parse, a blocked port: a bug or
 * configuration here, left as it is).
 */
function connectionFailed(error: unknown, url: string, signal: AbortSignal | undefined): CheckpointError | undefined {
  if (signal?.aborted || !(error instanceof TypeError) || error.cause === undefined) return undefined;
  const cause = error.cause as { code?: unknown; message?: unknown };
  // Only a failure of the connection itself: an errno (refused, reset, unreachable, DNS) or undici's
  // socket errors. fetch refuses some calls before connecting, with an uncoded cause (a port on its
  // bad-port list such as 6000, an unknown scheme) or UND_ERR_INVALID_ARG (a malformed header): ours.
  if (typeof cause.code !== "string" || !CONNECTION_FAILURE.test(cause.code)) return undefined;
  const why = typeof cause.message === "string" && cause.message ? cause.message : error.message;
  return new CheckpointError("upstream_failed", `${new URL(url).pathname}: the connection failed before the reply was complete (${why})`);
}

/** Throws the callee's refusal (or an internal error naming the call) unless the status is 2xx. */
export function expectOk(what: string, response: JsonResponse): unknown {
  if (response.status >= 200 && response.status < 300) return response.body;
  const refusal = ErrorReplySchema.safeParse(response.body);
  if (refusal.success) throw new CheckpointError(refusal.data.error.code, `${what}: ${refusal.data.error.detail}`);
  throw new CheckpointError("internal_error", `${what} answered HTTP ${response.status}`);
}

export function isRefusal(error: unknown, code: string): boolean {
  return error instanceof CheckpointError && error.code === code;
}

/** The `ng_session` value of a Set-Cookie header, if any. */
export function sessionCookieFrom(headers: Headers): string | undefined {
  const raw = headers.get("set-cookie");
  const match = raw ? /(?:^|[;,]\s*)ng_session=([^;,\s]+)/.exec(raw) : null;
  return match?.[1];
}

export function trimSlash(url: string): string {
  return url.replace(/\/+$/, "");
}
