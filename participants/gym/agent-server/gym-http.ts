import { CheckpointError, ErrorReplySchema } from "../../../protocol/index.js";
import { readCappedText } from "../../../protocol/capped-body.js";
import { UNTIMED_FETCH_DISPATCHER } from "../../../protocol/untimed-dispatcher.js";

/**
 * The small HTTP client the reference servers use for their data-plane calls. A refusal with the
 * standard error body becomes the same CheckpointError on this side, so the episode acts on the
 * callee's `admission_closed`; a route answering it to its own caller answers `upstream_failed`
 * instead (dependencyFailure), but for codes that mean the same there.
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

/** The `data` key marking a CheckpointError as a callee's refusal: the call it refused, and its detail. */
const CALLEE_REFUSAL = "callee_refusal";

/**
 * Throws the callee's refusal (or an internal error naming the call) unless the status is 2xx. It
 * keeps the callee's code, which the episode acts on (`admission_closed`: park and send again), and
 * is marked as the callee's: a route answering it says so (dependencyFailure).
 */
export function expectOk(what: string, response: JsonResponse): unknown {
  if (response.status >= 200 && response.status < 300) return response.body;
  const refusal = ErrorReplySchema.safeParse(response.body);
  const [code, detail] = refusal.success ? [refusal.data.error.code, refusal.data.error.detail] : (["internal_error", `answered HTTP ${response.status}`] as const);
  const message = refusal.success ? `${what}: ${detail}` : `${what} ${detail}`;
  throw new CheckpointError(code, message, { data: { [CALLEE_REFUSAL]: { call: what, detail } } });
}

/**
 * Callee codes a route answers as they are: they mean the same to its caller. `storage_error` is the
 * deployment's storage wherever it fails (the model proxy's ledger disk full: gym-ckpt collect waits
 * and sends the row again), `upstream_failed` already a dependency's failure.
 */
const PASSED_ON_CALLEE_CODES: ReadonlySet<string> = new Set(["storage_error", "upstream_failed"]);

/**
 * What a route (`/run`, the agent's `activate`) answers for `error`: a callee's refusal as
 * `upstream_failed` (a dependency failed), its code and detail in the detail, so the route's caller
 * never takes it for the route's own. Passed on unchanged, a resources server's `stale_attempt` or
 * `admission_closed` read as "this attempt never started" (sent again as if nothing ran), its
 * `invalid_request` as "the task is bad" (gym-ckpt collect fails the row for good), its `not_found`
 * as an unknown route. Anything else is answered as it is.
 */
export function dependencyFailure(error: unknown): unknown {
  if (!(error instanceof CheckpointError) || PASSED_ON_CALLEE_CODES.has(error.code)) return error;
  const refused = error.data?.[CALLEE_REFUSAL] as { call: string; detail: string } | undefined;
  if (!refused) return error;
  return new CheckpointError("upstream_failed", `a call this route depends on failed: ${refused.call} refused with ${error.code}: ${refused.detail}`, { cause: error });
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
