import { constants } from "node:buffer";
import { context, propagation } from "@opentelemetry/api";
import { Agent, fetch } from "undici";
import { CONTROLLER_OPS, CheckpointError, ErrorReplySchema, HEADER_COORDINATOR_EPOCH, HEADER_COORDINATOR_ID, HEADER_COORDINATOR_SERVED, describeZodError, parseCoordinatorEpochHeader, parseCoordinatorIdHeader, timeoutSignal, timerDelay, type ControllerOp, type CtlReplyOf, type CtlRequestInputOf, type CtlRequestOf } from "../../protocol/index.js";
import { readCappedText } from "../../protocol/capped-body.js";
import { UNTIMED_DISPATCHER } from "../../protocol/untimed-dispatcher.js";
import { httpRoute } from "../api/openapi.js";
import { MAX_STOP_GRACE_MS } from "../config/coordinator-config.js";
import { ControllerClient } from "./controller-client.js";
import { networkFailureCode } from "./network-failure.js";
import { neverSentCode } from "./never-sent.js";
import { LEASE_READ_REUSE_MS } from "./leader-watch.js";
import { pollUntil } from "./poll-until.js";
import { decodeControllerReply, DEFAULT_REPLY_TIMEOUT_MS, defaultWait, replyTimeoutMs } from "./reply-decoder.js";

export interface HttpControllerClientOptions {
  /** e.g. http://127.0.0.1:8480 */
  baseUrl: string;
  token: string;
  /** As `NatsControllerClientOptions.timeoutMs`. */
  timeoutMs?: number;
  /** Wait past a request's deadline (default 10 s). */
  slackMs?: number;
  /**
   * An op waits for its reply (see `timeoutMs`, `slackMs`) unless the coordinator stops being the
   * ready leader: its `/readyz` is asked this often while it waits (default 5 s).
   */
  readyCheckMs?: number;
  /** The largest op reply body read (default MAX_CONTROLLER_REPLY_BYTES). */
  maxReplyBytes?: number;
  /**
   * How long to retry while no coordinator is the ready leader (nobody listens at the address, or
   * `not_leader`), as the NATS client does. Default 0: a library caller behind a load balancer
   * decides itself; `gym-ckpt collect` passes its `--leader-wait-ms`.
   */
  leaderWaitMs?: number;
}

/**
 * The largest op reply body read by default (past it: `outcome_unknown`, the rest cancelled): the
 * longest string V8 makes, so no reply the client could read at all is refused. The API answers
 * over HTTP in full, and its largest replies repeat episode lists (up to 100,000 ids of 255
 * characters, ~26 MB) per participant, so no smaller fixed bound is safe; something answering with
 * an endless body, say a misbehaving proxy, still cannot grow this process past it.
 */
export const MAX_CONTROLLER_REPLY_BYTES = constants.MAX_STRING_LENGTH;

/** The largest `/readyz` body read: the API's is a few fields; past it the check counts as failed. */
export const MAX_READYZ_REPLY_BYTES = 64 * 1024;

/** Consecutive failed `/readyz` answers (not 200, or none in time) that end a wait: one slow answer is not a dead coordinator. */
const READY_FAILURES = 2;

/**
 * How long `/readyz` may be unreachable (a refused connection, or a proxy's 502/503 for one, see
 * UNREACHABLE_VIA_GATEWAY) while an op waits. Nothing listens there, yet the op's connection
 * stands, so the process lives: a coordinator stopping gracefully closes its listener first, then
 * answers the ops under way within its `stop_grace_ms` (at most MAX_STOP_GRACE_MS) and exits, which
 * drops the connection (`outcome_unknown` at once). Bounded all the same, with a minute for the
 * rest of its stop: a load balancer that refuses connections while no coordinator is ready would
 * otherwise leave an op sent to a host that died silently waiting its whole timeout.
 */
const STOPPING_WAIT_MS = MAX_STOP_GRACE_MS + 60_000;

/**
 * What a proxy answers `/readyz` with, in a body of its own, when it cannot connect to the
 * coordinator (nginx 502 for a refused connection, HAProxy's and Envoy's 503 for no healthy
 * upstream): behind a proxy, the refused connection of a coordinator stopping gracefully. Its
 * 504 (no answer in time: frozen, partitioned) is no stop and still fails the check, as the
 * API's own 503 `not_leader` does.
 */
const UNREACHABLE_VIA_GATEWAY = new Set([502, 503]);

/**
 * The network failures of a `/readyz` that read as a stop (networkFailureCode): its connection
 * refused (the listener closed), or cut by the coordinator closing its connections as its stop
 * begins (one written on a kept-alive connection as the stop closes it: undici's "other side
 * closed"), or reset as its listener closes. A frozen or partitioned coordinator resets nothing;
 * its checks time out.
 */
const STOPPING_CODES = new Set(["ECONNREFUSED", "ECONNRESET", "UND_ERR_SOCKET"]);

/**
 * The base URL must be http(s) without credentials (fetch refuses them): `127.0.0.1:8480` or
 * `localhost:8480` (no scheme) would otherwise fail only at the first call. Not echoed: it may carry a password.
 */
function checkBaseUrl(baseUrl: string): void {
  let url: URL;
  try {
    url = new URL(baseUrl);
  } catch {
    throw new CheckpointError("invalid_request", "the coordinator's HTTP URL is not a URL; give its scheme, host and port, e.g. http://127.0.0.1:8480");
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") {
    throw new CheckpointError("invalid_request", `the coordinator's HTTP URL must start with http:// or https:// (e.g. http://127.0.0.1:8480), not ${url.protocol}`);
  }
  if (url.username || url.password) throw new CheckpointError("invalid_request", "the coordinator's HTTP URL may not carry credentials; the token authenticates");
}

/**
 * fetch refused the request before opening a connection: an argument it rejects (a TypeError of
 * its own, with no network error as cause) or a port it blocks ("bad port", e.g. 1 or 6000).
 * Nothing was sent, so this is the caller's mistake, never `outcome_unknown`.
 */
function refusedBeforeSending(error: unknown): boolean {
  if (!(error instanceof TypeError)) return false;
  const cause = error.cause as { code?: unknown; message?: unknown } | undefined;
  if (cause === undefined) return error.message !== "fetch failed";
  return cause.code === undefined && cause.message === "bad port";
}

/** Never fetch's own message: a rejected header value is quoted in it, and that is the token. */
function describeCause(error: unknown): string {
  return (error as Error).cause === undefined ? "fetch refused its URL or headers (is the token one line of printable characters?)" : "fetch blocks that port (bad port)";
}

/**
 * A GET op's request, checked here as the server checks a body: it travels in the path alone, so a
 * field the op does not take would be dropped unseen (the NATS API refuses it), and `get`'s id is
 * refused as the server would refuse it (a URL resolves `.` and `..`, encoded or not, away, so `..`
 * would ask for another route and be `not_found`, never this refusal).
 */
function checkedGetRequest<O extends ControllerOp>(op: O, request: unknown): CtlRequestOf<O> {
  const parsed = CONTROLLER_OPS[op].request.safeParse(request);
  if (!parsed.success) throw new CheckpointError("invalid_request", describeZodError(parsed.error));
  return parsed.data as CtlRequestOf<O>;
}

/**
 * `route` (`/v1/status`, `/readyz`) below the base URL's path: a coordinator a proxy serves at
 * `https://gw/ckpt` is asked `https://gw/ckpt/v1/status`, not the host's `/v1/status` (another
 * service, or the proxy's 404). The base URL's query and fragment are no part of a route.
 */
function routeUrl(baseUrl: string, route: string): URL {
  const url = new URL(baseUrl);
  url.pathname = `${url.pathname.replace(/\/+$/, "")}${route}`;
  url.search = "";
  url.hash = "";
  return url;
}

/** The controller API over HTTP/JSON (fetch). */
export class HttpControllerClient extends ControllerClient {
  /** The last `/readyz` that answered ready, with when it was asked (monotonic ms): see watchReadiness. */
  private lastReady: { leader: ReadyLeader; askedAt: number } | undefined;

  constructor(private readonly options: HttpControllerClientOptions) {
    super();
    checkBaseUrl(options.baseUrl);
  }

  async call<O extends ControllerOp>(op: O, request: CtlRequestInputOf<O>): Promise<CtlReplyOf<O>> {
    // A duration within this process: a wall-clock step must neither end the leader wait nor stretch it.
    const waitUntil = performance.now() + (this.options.leaderWaitMs ?? 0);
    for (;;) {
      try {
        return await this.callOnce(op, request);
      } catch (error) {
        // not_leader promises nothing ran (refused before it began, or never sent): safe to send again.
        if (!(error instanceof CheckpointError && error.code === "not_leader") || performance.now() >= waitUntil) throw error;
        await new Promise((resolve) => setTimeout(resolve, 100));
      }
    }
  }

  private async callOnce<O extends ControllerOp>(op: O, request: CtlRequestInputOf<O>): Promise<CtlReplyOf<O>> {
    const { method, url } = httpRoute(op);
    let path = url;
    if (method === "GET") {
      const checked = checkedGetRequest(op, request);
      if (op === "get") path = url.replace("{checkpoint_id}", encodeURIComponent((checked as CtlRequestOf<"get">).checkpoint_id));
    }
    const timeout = replyTimeoutMs(op, request, this.options);
    const headers: Record<string, string> = { authorization: `Bearer ${this.options.token}`, ...(method === "POST" ? { "content-type": "application/json" } : {}) };
    // W3C traceparent of the caller's span, as the NATS client sends it: the op joins the caller's trace.
    propagation.inject(context.active(), headers);
    // Every wait is watched, as over NATS: a coordinator killed mid-op resets the connection at once
    // over HTTP, but a frozen or partitioned one would keep a 60 s deadline's op waiting 70 s. The
    // checks start beside the op only past the 90 s of an op that takes no deadline; otherwise one
    // period later, so an op answered sooner (most of them) is never ended by them. The watch stops
    // once the reply's headers are in: the op was answered, and a long body still arriving is read
    // whole (a dropped connection still cuts it off), whatever /readyz says then.
    const answered = new AbortController();
    const lost = new AbortController();
    // timeoutSignal, not AbortSignal.timeout: inside AbortSignal.any a GC could collect that (see timeout-signal.ts).
    const replyTimeout = timeoutSignal(timerDelay(timeout));
    const signal = AbortSignal.any([replyTimeout.signal, lost.signal]);
    this.watchReadiness(answered.signal, (error) => lost.abort(error), defaultWait(request, this.options) && timeout > DEFAULT_REPLY_TIMEOUT_MS ? "now" : "later");
    try {
      return await this.send(op, path, method, headers, request, signal, timeout, () => answered.abort());
    } finally {
      answered.abort();
      replyTimeout.clear();
    }
  }

  /**
   * Until `answered` aborts, `lose`s the op (`outcome_unknown`) once the coordinator that took it
   * fails `/readyz` READY_FAILURES times in a row (it stopped leading, or stopped answering: frozen,
   * partitioned without a reset), or `/readyz` names another epoch than when the op was sent (behind a
   * load balancer, another coordinator leads now), ready or refusing with a higher term held (a
   * successor not ready yet: the op's term lost the lease). The coordinator that took it is the ready leader
   * as it was sent, its id (the HEADER_COORDINATOR_ID of a `/readyz` answer) and epoch read beside
   * the op, or taken from a read sent at most LEASE_READ_REUSE_MS before it, as the NATS client
   * reads the lease; one read failing or refused then, the first ready answer later. The checks
   * start beside the op (`first` now) or one period after it was sent. A refusal naming another
   * coordinator (a standby behind the same balancer) says nothing about the op: neither a failure
   * nor a success, the op's own deadline bounds the wait. So does one naming a coordinator while the
   * op's is not known yet, unless it names a term too (HEADER_COORDINATOR_EPOCH: that coordinator
   * holds the lease without serving, so no ready leader serves, whoever took the op): a failure, and
   * that term, ready later, did not take the op (a ready leader took it; see `unserving`). A refusal
   * of a term that served (HEADER_COORDINATOR_SERVED: a leader stopping gracefully, which answers its
   * ops before it lets the lease go, or whose renewal lapsed) says nothing either, whoever took the op:
   * it may be answering it. A refusal naming none (a coordinator before that header) counts as the op's coordinator's. A `/readyz`
   * whose connection is refused or reset as it closes, or a proxy's 502/503 for it, is no failure
   * (see STOPPING_WAIT_MS): the coordinator closes its connections and listener to stop gracefully,
   * and answers the op or exits, which drops the op's connection.
   */
  private watchReadiness(answered: AbortSignal, lose: (error: CheckpointError) => void, first: "now" | "later"): void {
    let failures = 0;
    const sentAt = performance.now();
    const kept = this.lastReady && sentAt - this.lastReady.askedAt < LEASE_READ_REUSE_MS ? this.lastReady : undefined;
    let took: ReadyLeader | undefined = kept?.leader;
    // Terms seen holding the lease without serving since the op was sent, while its coordinator was
    // not known: ready later, such a term is a successor that did not serve yet (a new leader waits a
    // lease period and recovers first), never the ready leader that took the op, as the NATS client
    // reads a lease that did not serve yet. A term that served (a lapsed renewal, a stop) says so and is
    // never taken for one: ready again, it may be the one answering the op.
    const unserving = new Set<number>();
    let unreachableSince: number | undefined;
    const lost = (why: string) => new CheckpointError("outcome_unknown", `the coordinator at ${this.options.baseUrl} ${why} before it answered; retry the op to learn its outcome`);
    const everyMs = this.options.readyCheckMs ?? 5_000;
    const readyz = async (): Promise<ReadyzAnswer> => {
      const askedAt = performance.now();
      // Given up with the wait too (the op's reply came): left open, it would hold its socket, and a
      // CLI process that has its answer, until it timed out.
      const checkTimeout = timeoutSignal(everyMs);
      const answer = await fetch(routeUrl(this.options.baseUrl, "/readyz"), { signal: AbortSignal.any([checkTimeout.signal, answered]), redirect: "manual", dispatcher: UNTIMED_DISPATCHER })
        .then(async (response): Promise<ReadyzAnswer> => {
          // The coordinator that answered is named in a header (absent from a coordinator before it).
          const answeredBy = parseCoordinatorIdHeader(response.headers.get(HEADER_COORDINATOR_ID));
          if (response.status === 200) return readyAnswer(JSON.parse(await readCappedText(response, MAX_READYZ_REPLY_BYTES, "/readyz")), answeredBy);
          // Read up to the cap (a proxy's 503 may be endless), to tell the API's own refusal from a proxy's.
          if (UNREACHABLE_VIA_GATEWAY.has(response.status)) {
            const text = await readCappedText(response, MAX_READYZ_REPLY_BYTES, "/readyz").catch(() => "");
            if (!isRefusal(text)) return "unreachable";
            const heldEpoch = parseCoordinatorEpochHeader(response.headers.get(HEADER_COORDINATOR_EPOCH));
            return { ready: false, refusedBy: answeredBy, heldEpoch, served: heldEpoch !== undefined && response.headers.get(HEADER_COORDINATOR_SERVED) === "1" };
          }
          // Any other refusal's body is not read at all (cancelled, closing the connection).
          await response.body?.cancel().catch(() => undefined);
          return undefined;
        })
        .catch((error: unknown) => (STOPPING_CODES.has(networkFailureCode(error) ?? "") ? ("unreachable" as const) : undefined))
        .finally(() => checkTimeout.clear());
      const leader = readyLeaderOf(answer);
      if (leader) this.lastReady = { leader, askedAt };
      return answer;
    };
    // Who led as the op was sent: the first check when it is asked now. Not a check itself (one
    // period later is the first that can fail the op): a `status` a follower answers
    // is refused by its /readyz all along.
    const asSent =
      kept || first === "now"
        ? undefined
        : readyz().then((answer) => {
            took ??= readyLeaderOf(answer);
            if (took === undefined && typeof answer === "object" && !answer.ready && answer.heldEpoch !== undefined && !answer.served) unserving.add(answer.heldEpoch);
          });
    const check = async () => {
      await asSent;
      const answer = await readyz();
      if (answer === "unreachable") {
        unreachableSince ??= performance.now();
        failures = 0;
        return performance.now() - unreachableSince >= STOPPING_WAIT_MS ? lost(`was unreachable (refused or reset connections, or a proxy could not reach it) for ${Math.round(STOPPING_WAIT_MS / 1000)} s, longer than any stop takes,`) : undefined;
      }
      unreachableSince = undefined;
      const leader = readyLeaderOf(answer);
      if (leader) {
        if (took !== undefined && leader.epoch !== took.epoch) return lost(`changed leader (epoch ${String(took.epoch)}, now ${String(leader.epoch)})`);
        if (took === undefined && typeof leader.epoch === "number" && unserving.has(leader.epoch)) {
          return lost(`changed leader (coordinator ${leader.id ?? "(unnamed)"} leads in epoch ${leader.epoch}, a term that did not serve yet after the op was sent)`);
        }
        took ??= leader;
        failures = 0;
        return undefined;
      }
      const refusal = answer?.ready === false ? answer : undefined;
      // A term above the op's holds the lease (a successor, ready or not yet): the op's term is gone.
      if (refusal?.heldEpoch !== undefined && typeof took?.epoch === "number" && refusal.heldEpoch > took.epoch) return lost(`changed leader (epoch ${took.epoch}, now ${refusal.heldEpoch})`);
      // A term that served refusing (stopping gracefully, or its renewal lapsed) may be answering the
      // op: no word on it, as a standby's. It lets the lease go only once its ops are answered.
      if (refusal?.served) return undefined;
      // Another coordinator's refusal, or a standby's while the op's is unknown: no word on the op's.
      if (refusal?.refusedBy !== undefined && refusal.refusedBy !== took?.id) {
        if (took !== undefined || refusal.heldEpoch === undefined) return undefined;
        unserving.add(refusal.heldEpoch);
      }
      failures += 1;
      const who = took?.id === undefined ? "" : ` (coordinator ${took.id})`;
      return failures >= READY_FAILURES ? lost(`stopped being the ready leader${who}`) : undefined;
    };
    void pollUntil(check, everyMs, answered, first).then(lose);
  }

  private async send<O extends ControllerOp>(
    op: O,
    path: string,
    method: string,
    headers: Record<string, string>,
    request: CtlRequestInputOf<O>,
    signal: AbortSignal,
    timeout: number,
    headersIn: () => void,
    /** Set on a read sent again: its own new connection (see below). */
    fresh?: Agent,
  ): Promise<CtlReplyOf<O>> {
    let response: Response;
    try {
      response = await fetch(routeUrl(this.options.baseUrl, path), {
        method,
        headers,
        ...(CONTROLLER_OPS[op].method === "POST" ? { body: JSON.stringify(request) } : {}),
        signal,
        // Never followed (see redirectRefusal): the coordinator never redirects.
        redirect: "manual",
        dispatcher: fresh ?? UNTIMED_DISPATCHER,
      });
    } catch (error) {
      if (error instanceof CheckpointError) throw error; // the readiness watch ended the wait
      if ((error as Error).name === "TimeoutError") throw new CheckpointError("outcome_unknown", `no reply from ${path} within ${Math.round(timeout)} ms`);
      if (refusedBeforeSending(error)) throw new CheckpointError("invalid_request", `cannot send ${op} to ${this.options.baseUrl}: ${describeCause(error)}`);
      // Only a connection that was never made proves nothing was sent; a reset after that may
      // have cut off a reply to an op that ran (a coordinator crashing mid-commit).
      const notSent = neverSentCode(error);
      if (notSent !== undefined) throw new CheckpointError("not_leader", `cannot reach the coordinator at ${this.options.baseUrl}: ${notSent}`);
      // A read changes nothing, so a cut before its reply (a kept-alive connection the coordinator
      // closed as the request was written, as its stop does) is sent again, once, on a connection of
      // its own: the pool's other kept-alive ones may have been closed by the same stop. An op that
      // changes state is not: no client can tell that cut from a coordinator exiting mid-op.
      if (CONTROLLER_OPS[op].method === "GET" && fresh === undefined) {
        const agent = new Agent({ headersTimeout: 0, bodyTimeout: 0 });
        try {
          return await this.send(op, path, method, headers, request, signal, timeout, headersIn, agent);
        } finally {
          void agent.close().catch(() => undefined);
        }
      }
      const code = ((error as Error).cause as { code?: string } | undefined)?.code;
      throw new CheckpointError("outcome_unknown", `the connection to ${this.options.baseUrl} failed during ${op}: ${code ?? (error as Error).message}; retry with the same arguments`);
    }
    headersIn();
    if (response.status >= 300 && response.status < 400) {
      await response.body?.cancel().catch(() => undefined);
      throw redirectRefusal(op, this.options.baseUrl, response.status, response.headers.get("location"));
    }
    let text: string;
    try {
      text = await readCappedText(response, this.options.maxReplyBytes ?? MAX_CONTROLLER_REPLY_BYTES, `the reply to ${op}`);
    } catch (error) {
      // A reply past the limit is not read, as one cut off: the op may have run.
      if (error instanceof CheckpointError && error.code === "payload_too_large") throw new CheckpointError("outcome_unknown", `${error.message}, not read; the op may have run`);
      if (error instanceof CheckpointError) throw error;
      throw new CheckpointError("outcome_unknown", `the reply to ${op} was cut off: ${(error as Error).message}; retry with the same arguments`);
    }
    if (GATEWAY_ERRORS.has(response.status) && !isRefusal(text)) {
      throw new CheckpointError(
        "outcome_unknown",
        `${path} was answered HTTP ${response.status} by something in front of the coordinator (a proxy or load balancer), not by its API; the op may have run or still run: retry with the same arguments`,
      );
    }
    return decodeControllerReply(op, text);
  }
}

/**
 * A redirect answered in the coordinator's place (an ingress sending http:// on to https://): the
 * coordinator never redirects, so something in front answered and nothing ran. Followed, fetch
 * turned a POST into a bodiless GET (301, 302, 303) and dropped the token on a cross-origin hop:
 * the op came back as the target's refusal of another request (a commit `not_found`, "no route
 * GET /v1/commit", read as an unknown id). The URL to give instead is named, without credentials.
 */
function redirectRefusal(op: string, baseUrl: string, status: number, location: string | null): CheckpointError {
  let target = "nowhere (no Location)";
  if (location !== null) {
    try {
      const url = new URL(location, baseUrl);
      url.username = "";
      url.password = "";
      target = url.href;
    } catch {
      target = "a Location that is no URL";
    }
  }
  return new CheckpointError("invalid_request", `${baseUrl} answered ${op} with a redirect (HTTP ${status}) to ${target}, which the client does not follow; nothing ran: give the coordinator's own URL`);
}

/**
 * Statuses a proxy or load balancer answers for the coordinator (upstream reset, read timeout, no
 * upstream) in a body of its own: the request may have reached the coordinator. The API's own 502,
 * 503 and 504 are catalog refusals (`reply_too_large`, `not_leader`/`unreachable`/`journal_unavailable`, `outcome_unknown`).
 */
const GATEWAY_ERRORS = new Set([502, 503, 504]);

/** The body is the API's `{"error":{"code","detail"}}`. */
function isRefusal(text: string): boolean {
  try {
    return ErrorReplySchema.safeParse(JSON.parse(text)).success;
  } catch {
    return false;
  }
}

/** The ready leader a `/readyz` 200 names: its id (header; undefined from a coordinator before it) and epoch (body). */
interface ReadyLeader {
  id: string | undefined;
  epoch: unknown;
}

/**
 * A `/readyz` answer: ready (naming the leader), the API's refusal (naming the coordinator that
 * refused, the term it holds and whether that term served, when it does), a stop in progress ("unreachable", see STOPPING_WAIT_MS), or none
 * (undefined: no answer in time, another status, a body past the cap).
 */
type ReadyzAnswer = { ready: true; leader: ReadyLeader } | { ready: false; refusedBy: string | undefined; heldEpoch: number | undefined; served: boolean } | "unreachable" | undefined;

/** The leader a ready answer names; undefined for any other answer. */
function readyLeaderOf(answer: ReadyzAnswer): ReadyLeader | undefined {
  return typeof answer === "object" && answer.ready ? answer.leader : undefined;
}

/** A 200's body, read leniently (a stand-in's may name no epoch), and the coordinator its header names. `null` is no answer. */
function readyAnswer(body: unknown, id: string | undefined): ReadyzAnswer {
  if (body === null) return undefined;
  const fields = (typeof body === "object" ? body : {}) as { epoch?: unknown };
  return { ready: true, leader: { id, epoch: fields.epoch } };
}
