import type { Context } from "@opentelemetry/api";
import type { Cancellation } from "./cancellation.js";

/** Nobody is subscribed on the subject (NATS no-responders): the participant is unreachable. */
export class NoRespondersFailure extends Error {
  constructor(subject: string) {
    super(`no responders on ${subject}`);
    this.name = "NoRespondersFailure";
  }
}

/** The request timed out: the participant may or may not have acted. */
export class RequestTimeoutFailure extends Error {
  constructor(subject: string, timeoutMs: number) {
    super(`no reply on ${subject} within ${timeoutMs} ms`);
    this.name = "RequestTimeoutFailure";
  }
}

/**
 * The connection went away while the request waited (lost, or closed for good): an unknown outcome
 * like a timeout, failed at once; its message names the connection rather than a timeout that never ran.
 */
export class ConnectionLostFailure extends RequestTimeoutFailure {
  constructor(subject: string, how: "lost" | "closed") {
    super(subject, 0);
    this.message = how === "closed" ? `the NATS connection closed before a reply on ${subject}` : `the client lost its NATS connection before a reply on ${subject}`;
    this.name = "ConnectionLostFailure";
  }
}

/**
 * The membership view showed the addressed process replaced while the request waited: an unknown
 * outcome like a timeout (the old process may have acted before it died), sent again at once
 * rather than when the try would have timed out, to whichever process answers now.
 */
export class ReplacedProcessFailure extends RequestTimeoutFailure {
  /** `who`: the participant, as kind/instance. */
  constructor(who: string) {
    super(who, 0);
    this.message = `${who} was replaced by a new process (its announcement seen) before it answered`;
    this.name = "ReplacedProcessFailure";
  }
}

export interface TransportRequestOptions {
  timeoutMs: number;
  /** Bearer token sent in the Authorization header. */
  token: string;
  /** Trace context injected as W3C traceparent/tracestate headers. */
  context?: Context;
  /** The sender's clock (ms since the epoch) when it sends: the Gym-Sent-At header, from which a participant diagnoses clock skew. */
  sentAtMs?: number;
  /** Stops waiting for the reply: the request rejects with the reason it is cancelled or interrupted with. */
  cancellation?: Cancellation;
}

/**
 * One directed request/reply. The NATS implementation maps no-responders and timeouts to the two
 * failure classes above; unit tests use in-memory fakes.
 */
export interface ParticipantTransport {
  request(subject: string, body: string, options: TransportRequestOptions): Promise<string>;
}
