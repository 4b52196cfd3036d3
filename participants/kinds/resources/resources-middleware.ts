import type { FastifyInstance, FastifyReply, FastifyRequest } from "fastify";
import { CheckpointError, ROLLOUT_PREFIX, parseCaptureKey, parseRolloutPath, sameEpisode, type EpisodeId, type RolloutPath } from "../../../protocol/index.js";
import { sendRefusal } from "../../http/http-refusal.js";
import type { RequestRole, RequestTicket, ResourcesKind } from "./resources-kind.js";
import { HEADER_CHECKPOINT_RESTART, HEADER_CHECKPOINT_VERIFY, ROUTE_CLOSE, ROUTE_SEED, ROUTE_VERIFY } from "./resources-modes.js";
import { newSessionId, readSessionCookie, sessionCookieHeader } from "./session-cookie.js";

/** What route handlers learn about the request's session, and the explicit lifecycle hooks. */
export interface SessionAccess {
  /** The episode and session of an admitted request; undefined outside the checkpoint middleware. */
  of(request: FastifyRequest): { episode: EpisodeId; sessionId: string | undefined } | undefined;
  /** Like `of`, but the session id must exist (it always does on `/seed_session`). */
  require(request: FastifyRequest): { episode: EpisodeId; sessionId: string };
  /**
   * For reset/step protocols: this request starts a session (issues the cookie if needed). Call it
   * before changing anything: on a restart_only server it throws `admission_closed` while a
   * checkpoint is open.
   */
  started(request: FastifyRequest): string;
  /** For reset/step protocols: this request ends its session, once its reply is a 2xx. */
  ended(request: FastifyRequest): void;
  /**
   * Aborted when a retire covers the request's attempt or session (its reason is a `stale_attempt`
   * CheckpointError). The retire waits for the request: a handler that waits on anything that may
   * not come (other members of a cohort, a long poll) must stop on it. Never aborts outside the
   * checkpoint middleware.
   */
  signal(request: FastifyRequest): AbortSignal;
}

interface Admitted {
  ticket: RequestTicket;
  sessionId: string | undefined;
  issueCookie: boolean;
  seedReply: boolean;
  /**
   * Fastify has its body (or it has none): from here it runs the handler or replies with an
   * error even after the client went away, so the request stays in flight until onSend.
   */
  read: boolean;
  /** The client went away before that: released, and refused should it get further. */
  abandoned: boolean;
  /** onSend ran (it releases the request). */
  sending: boolean;
  /** `sessions.started` bound a session nobody held: a reply that is no 2xx unbinds it. */
  startedFresh: boolean;
  /** `sessions.ended` was called: a 2xx reply ends the session, as a 2xx `/verify` does. */
  endOnSuccess: boolean;
  /** onSend ran with a 2xx: an `ended` called later (a streamed reply's handler still writing) ends at once. */
  succeeded: boolean;
  /**
   * Its route handler was called and has not settled: an async handler may send its reply and go
   * on changing the session, so the reply's end alone does not release the request.
   */
  inHandler: boolean;
  /** The reply is done while the handler still ran: released once the handler settles. */
  releaseDeferred: boolean;
}

function isThenable(value: unknown): value is PromiseLike<unknown> {
  return typeof value === "object" && value !== null && typeof (value as { then?: unknown }).then === "function";
}

/** A payload Fastify pipes out after onSend (a Node or web stream, a fetch Response), not one it writes at once. */
function isStreamed(payload: unknown): boolean {
  return typeof payload === "object" && payload !== null && !(payload instanceof Uint8Array);
}

/**
 * The route Fastify matched, without the rollout prefix (`/ng-rollout/:capture_key/seed_session`
 * → `/seed_session`): the raw path may be percent-encoded (`/%73eed_session` reaches the seed
 * handler too). The path itself when no route matched.
 */
function matchedRoute(request: FastifyRequest, path: string): string {
  const url = request.routeOptions.url;
  if (url === undefined) return path;
  if (!url.startsWith(ROLLOUT_PREFIX)) return url;
  const slash = url.indexOf("/", ROLLOUT_PREFIX.length);
  return slash === -1 ? "/" : url.slice(slash);
}

/**
 * The request's rollout, as the route Fastify matched reads it: a prefixed route's decoded
 * `capture_key` param, so a percent-encoded prefix (`/ng-%72ollout/r1/…` reaches the prefixed
 * handler too) cannot hide the episode and fall back to the cookie's. The raw path's prefix
 * otherwise (no route matched, or one registered outside the prefix); "invalid" when either
 * names no valid capture key or the two disagree.
 */
function rolloutOf(request: FastifyRequest, path: string): RolloutPath | undefined | "invalid" {
  const raw = parseRolloutPath(path);
  const url = request.routeOptions.url;
  if (url === undefined || !url.startsWith(ROLLOUT_PREFIX)) return raw;
  const key = (request.params as { capture_key?: unknown } | undefined)?.capture_key;
  const episode = typeof key === "string" ? parseCaptureKey(key) : null;
  if (!episode || raw === "invalid" || (raw && !sameEpisode(raw.episode, episode))) return "invalid";
  return { episode, captureKey: key as string, route: matchedRoute(request, path) };
}

/** The signal of a request the checkpoint middleware did not admit: nothing retires it. */
const NEVER_ABORTED = new AbortController().signal;

function roleOf(route: string): RequestRole {
  // Without a matched route this is the request's own path: trimmed in one pass (/\/+$/ backtracks
  // quadratically on a long run of slashes before other text).
  const path = route.split("?")[0]!;
  let end = path.length;
  while (end > 0 && path[end - 1] === "/") end -= 1;
  const trimmed = path.slice(0, end);
  if (trimmed === ROUTE_SEED) return "seed";
  if (trimmed === ROUTE_VERIFY) return "verify";
  if (trimmed === ROUTE_CLOSE) return "close";
  return "other";
}

/**
 * Installs the checkpoint middleware on a fastify app (before its routes). GET/HEAD,
 * `/ng-control/*` and routes declared with `config: { checkpointing: false }` (operator or test
 * controls that touch no session) pass through; every other request is admitted by the resources kind:
 * waits for resume when it must, is fenced, counted, and its success binds or ends the session
 * while it still counts in flight.
 */
export function installResourcesCheckpointing(app: FastifyInstance, kind: ResourcesKind): SessionAccess {
  const admitted = new WeakMap<FastifyRequest, Admitted>();

  app.addHook("onRequest", async (request, reply) => {
    if (request.method === "GET" || request.method === "HEAD") return;
    const path = request.url.split("?")[0]!;
    if (path.startsWith("/ng-control/")) return;
    if ((request.routeOptions.config as { checkpointing?: unknown } | undefined)?.checkpointing === false) return;
    const abort = new AbortController();
    const onClose = () => abort.abort();
    reply.raw.once("close", onClose);
    try {
      const cookie = readSessionCookie(request.headers.cookie);
      const parsed = rolloutOf(request, path);
      if (parsed === "invalid") throw new CheckpointError("invalid_request", "the /ng-rollout/ prefix does not hold a valid capture key");
      let episode: EpisodeId;
      if (parsed) {
        episode = parsed.episode;
      } else {
        const bound = cookie === undefined ? undefined : kind.sessionEpisode(cookie);
        if (!bound) throw new CheckpointError("rollout_id_required", "send episode-scoped calls under /ng-rollout/<capture_key>/");
        episode = bound;
      }
      const role = roleOf(matchedRoute(request, parsed ? parsed.route : path));
      let sessionId = cookie;
      if (role === "seed") {
        // A seed keeps the cookie only when it already names this episode's session.
        const bound = cookie === undefined ? undefined : kind.sessionEpisode(cookie);
        if (!(bound && sameEpisode(bound, episode))) sessionId = newSessionId();
      }
      const ticket = await kind.admit({ episode, sessionId, role }, abort.signal);
      reply.raw.off("close", onClose);
      if (role === "seed" && sessionId !== undefined && sessionId === cookie) {
        // Decided before the wait for resume: the session may have ended meanwhile (a replayable
        // verify served during the checkpoint ends it at reopen, and its state is being freed), so
        // the seed keeps the cookie only if it still names this episode's session.
        const still = kind.sessionEpisode(sessionId);
        if (!(still && sameEpisode(still, episode))) sessionId = newSessionId();
      }
      // A late close of another attempt: its session lives on under the attempt that owns it now,
      // so the handler must not free it. Closing is never refused, so it is answered as done.
      const bound = role === "close" && sessionId !== undefined ? kind.sessionEpisode(sessionId) : undefined;
      if (bound && !sameEpisode(bound, episode)) {
        kind.release(ticket);
        return reply.code(200).type("application/json").send({});
      }
      const entry: Admitted = {
        ticket,
        sessionId,
        issueCookie: role === "seed" && sessionId !== cookie,
        seedReply: role === "seed",
        read: false,
        abandoned: false,
        sending: false,
        startedFresh: false,
        endOnSuccess: false,
        succeeded: false,
        inHandler: false,
        releaseDeferred: false,
      };
      admitted.set(request, entry);
      // Before its body is read, a closed request never gets an onSend (Fastify waits forever on
      // the destroyed stream, or fails the read): release it now. Once read, onSend releases it.
      const releaseIfUnread = () => {
        if (entry.read) return;
        entry.abandoned = true;
        kind.release(ticket);
      };
      if (reply.raw.destroyed || reply.raw.writableFinished) releaseIfUnread();
      else reply.raw.once("close", releaseIfUnread);
    } catch (error) {
      reply.raw.off("close", onClose);
      return sendRefusal(reply, error, kind.kind);
    }
  });

  // Registered first, so it runs right after the body was parsed (synchronously, same tick).
  app.addHook("preValidation", async (request) => {
    const entry = admitted.get(request);
    if (!entry) return;
    if (entry.abandoned) throw new CheckpointError("admission_closed", "the client went away before its request was read");
    entry.read = true;
  });

  // The fences again at the handler's start: a retire that came meanwhile waits for this request.
  // Once the handler settled, a request Fastify will not reply to gets no onSend: release it then.
  app.addHook("onRoute", (route) => {
    const handler = route.handler;
    route.handler = function (this: FastifyInstance, request, reply) {
      const entry = admitted.get(request);
      if (!entry) return handler.call(this, request, reply);
      kind.enter(entry.ticket);
      entry.inHandler = true;
      let result: unknown;
      try {
        result = handler.call(this, request, reply);
      } catch (error) {
        handlerSettled(entry);
        throw error;
      }
      if (isThenable(result)) {
        return result.then(
          (payload) => (handlerSettled(entry), releaseUnanswered(entry, request, reply, { payload }), payload),
          (error: unknown) => {
            handlerSettled(entry);
            releaseUnanswered(entry, request, reply, { failed: true });
            throw error;
          },
        );
      }
      handlerSettled(entry);
      // A synchronous handler that returned nothing sent its reply itself, hijacked it, or sends later.
      if (result === undefined) releaseUnanswered(entry, request, reply, { payload: undefined, sync: true });
      return result;
    };
  });

  /**
   * The request's reply is done (or will never come): released, unless its handler still runs. An
   * async handler may reply early (`reply.send`, then more work): it still changes the session, so
   * it counts in flight (and a retire waits for it) until it settled.
   */
  const releaseReplied = (entry: Admitted) => {
    if (entry.inHandler) entry.releaseDeferred = true;
    else kind.release(entry.ticket);
  };

  const handlerSettled = (entry: Admitted) => {
    entry.inHandler = false;
    if (entry.releaseDeferred) kind.release(entry.ticket);
  };

  /**
   * Mirrors when Fastify sends nothing after the handler (so no onSend runs): the reply was
   * hijacked or already ended, or an async handler resolved undefined after its client left.
   */
  const releaseUnanswered = (
    entry: Admitted,
    request: FastifyRequest,
    reply: FastifyReply,
    outcome: { payload?: unknown; failed?: boolean; sync?: boolean },
  ) => {
    if (entry.sending) return;
    let sends: boolean;
    if (reply.sent) sends = false;
    else if (outcome.failed) sends = true;
    else if (outcome.sync) {
      // It may still call reply.send (onSend releases it), or hijack or end the reply itself later:
      // then nothing else would, so that reply's end does. A client gone before either leaves the
      // reply unsent: the handler still runs and is waited for, as for any request.
      reply.raw.once("close", () => {
        if (!entry.sending && reply.sent) unanswered(entry, reply);
      });
      return;
    } else {
      const clientGone = request.raw.aborted || !request.socket || request.socket.destroyed;
      sends = outcome.payload !== undefined || (!reply.raw.headersSent && !clientGone);
    }
    if (!sends) unanswered(entry, reply);
  };

  /** A request Fastify sends no reply for (so no onSend runs). */
  const unanswered = (entry: Admitted, reply: FastifyReply) => {
    // No onSend, so no cookie was issued and nothing could ever name a session `started` bound for
    // this request: unbound, as for a refused reset (a hijacked reply neither binds nor ends one).
    if (entry.startedFresh && entry.sessionId !== undefined) kind.end(entry.sessionId, entry.ticket.episode);
    // A hijacked reply may still be written by its handler: released once its response is done.
    if (reply.raw.writableEnded || reply.raw.destroyed) releaseReplied(entry);
    else reply.raw.once("close", () => releaseReplied(entry));
  };

  app.addHook("onSend", async (request, reply, payload) => {
    const entry = admitted.get(request);
    if (!entry) return payload;
    entry.sending = true;
    // Bound or ended while still in flight: a prepare that sees the request gone sees its session.
    try {
      if (entry.seedReply) {
        reply.header(HEADER_CHECKPOINT_VERIFY, kind.verify);
        if (kind.mode === "restart_only") reply.header(HEADER_CHECKPOINT_RESTART, "1");
      }
      if (reply.statusCode >= 200 && reply.statusCode < 300) {
        kind.succeeded({ ...entry.ticket, sessionId: entry.sessionId });
        entry.succeeded = true;
        if (entry.endOnSuccess && entry.sessionId !== undefined) kind.endServed(entry.ticket, entry.sessionId);
        if (entry.issueCookie && entry.sessionId !== undefined) reply.header("set-cookie", sessionCookieHeader(entry.sessionId));
      } else if (entry.startedFresh && entry.sessionId !== undefined) {
        // A refused reset starts nothing, like a refused seed: its cookie is never issued, so no
        // request could ever end that session (live, exported and a restart for good).
        kind.end(entry.sessionId, entry.ticket.episode);
      }
    } finally {
      // A streamed reply (an MCP call's SSE) is still being produced after onSend: it stays in
      // flight until its response is done, or a prepare would pass while its handler still writes.
      if (isStreamed(payload) && !reply.raw.writableEnded && !reply.raw.destroyed) reply.raw.once("close", () => releaseReplied(entry));
      else releaseReplied(entry);
    }
    return payload;
  });

  const of = (request: FastifyRequest) => {
    const entry = admitted.get(request);
    return entry ? { episode: entry.ticket.episode, sessionId: entry.sessionId } : undefined;
  };
  return {
    of,
    require(request) {
      const found = of(request);
      if (!found?.sessionId) throw new CheckpointError("invalid_request", `no ${"ng_session"} cookie: seed a session first`);
      return { episode: found.episode, sessionId: found.sessionId };
    },
    started(request) {
      const entry = admitted.get(request);
      if (!entry) throw new CheckpointError("invalid_request", "this request did not pass the checkpoint middleware");
      kind.checkStart(entry.ticket);
      const bound = entry.sessionId === undefined ? undefined : kind.sessionEpisode(entry.sessionId);
      // A cookie whose session's state is being freed (it ended) names no session to take up: the
      // running free would delete the state this request builds under it.
      if (entry.sessionId === undefined || (bound && !sameEpisode(bound, entry.ticket.episode)) || (!bound && kind.isFreeing(entry.sessionId))) {
        entry.sessionId = newSessionId();
        entry.issueCookie = true;
      }
      if (kind.sessionEpisode(entry.sessionId) === undefined) entry.startedFresh = true;
      kind.bind(entry.sessionId, entry.ticket.episode);
      entry.seedReply = true;
      return entry.sessionId;
    },
    ended(request) {
      // Ended once the reply is a 2xx: a refused terminal step is retried on the same session.
      const entry = admitted.get(request);
      if (!entry) return;
      entry.endOnSuccess = true;
      // Called after a 2xx onSend (a streamed reply's handler learns the end while it writes): no
      // later hook would end it.
      if (entry.succeeded && entry.sessionId !== undefined) kind.endServed(entry.ticket, entry.sessionId);
    },
    signal(request) {
      return admitted.get(request)?.ticket.signal ?? NEVER_ABORTED;
    },
  };
}
