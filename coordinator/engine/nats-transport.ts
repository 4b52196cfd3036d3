import { randomBytes } from "node:crypto";
import { createInbox, errors, headers, type ConnectionOptions, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import { CheckpointError, HEADER_AUTHORIZATION, HEADER_SENT_AT, decodedHeaders, formatSentAt, MAX_CONTROL_MESSAGE_BYTES, timerDelay } from "../../protocol/index.js";
import { injectTraceContext } from "../telemetry/nats-trace-headers.js";
import { ConnectionLostFailure, NoRespondersFailure, RequestTimeoutFailure, type ParticipantTransport, type TransportRequestOptions } from "./transport.js";

interface Pending {
  subject: string;
  timeoutMs: number;
  resolve: (text: string) => void;
  reject: (error: Error) => void;
  timer: NodeJS.Timeout;
  /** Ends the request's cancellation listener once it is settled. */
  stopListening?: (() => void) | undefined;
}

function tooLarge(subject: string, size: number): CheckpointError {
  return new CheckpointError(
    "payload_too_large",
    `the request on ${subject} is ${size} bytes; with its headers it must fit one NATS message (at most ${MAX_CONTROL_MESSAGE_BYTES} bytes); nothing was sent`,
  );
}

/** NATS status code the server puts on the reply when nobody is subscribed to the subject. */
const NO_RESPONDERS = 503;

/**
 * Core NATS request/reply with the bearer token, W3C trace context and send time in the headers: the
 * coordinator's requests to participants, and the controller client's requests to the coordinator.
 *
 * Requests share one reply subscription (`<inbox>.<token>`: see replyToken) and a plain timer each, instead of
 * `nc.request`: the coordinator sends hundreds of requests per checkpoint, and the client's own
 * request path builds an Error (a stack trace) for every one it settles, which shows up as the
 * largest single cost in profiles. Semantics are the same: a reply resolves, the server's
 * no-responders status is `NoRespondersFailure`, anything else is `RequestTimeoutFailure` — an
 * unknown outcome the caller retries idempotently: a timeout, or a disconnect that may have lost
 * the reply (`ConnectionLostFailure`, naming the connection).
 * A body over the control-message limit (or over the server's max_payload with its headers) is
 * `payload_too_large` and is never sent.
 */
export class NatsParticipantTransport implements ParticipantTransport {
  private readonly inbox: string;
  private readonly pending = new Map<string, Pending>();
  private subscription: Subscription | undefined;
  private watchDisconnects: Promise<void> | undefined;
  private seq = 0;
  /** Random bytes drawn 256 tokens at a time (one randomBytes call, not one per request). */
  private random = Buffer.alloc(0);
  private randomAt = 0;

  constructor(
    private readonly nc: NatsConnection,
    /**
     * The replies' prefix; default the connection's `inboxPrefix`, as nats.js's own requests and the
     * KV clients' are: a role may subscribe only to its own prefix (deploy/nats/nats-server.production.conf).
     * The coordinator's ops to participants take NATS_OP_REPLY_PREFIX, the one prefix participants may answer on.
     */
    inboxPrefix?: string,
  ) {
    this.inbox = createInbox(inboxPrefix ?? (nc as Partial<{ options: ConnectionOptions }>).options?.inboxPrefix);
  }

  request(subject: string, body: string, options: TransportRequestOptions): Promise<string> {
    // Refused here, as the HTTP client's 413: the receiver would refuse it, and nats.js throws its own error.
    const size = Buffer.byteLength(body);
    if (size > MAX_CONTROL_MESSAGE_BYTES) return Promise.reject(tooLarge(subject, size));
    if (options.cancellation?.reason) return Promise.reject(options.cancellation.reason);
    this.subscribe();
    const h = headers();
    h.set(HEADER_AUTHORIZATION, `Bearer ${options.token}`);
    if (options.context) injectTraceContext(h, options.context);
    if (options.sentAtMs !== undefined) h.set(HEADER_SENT_AT, formatSentAt(options.sentAtMs));
    const token = this.replyToken();
    const timeoutMs = timerDelay(options.timeoutMs);
    return new Promise<string>((resolve, reject) => {
      const timer = setTimeout(() => {
        this.pending.delete(token);
        reject(new RequestTimeoutFailure(subject, options.timeoutMs));
      }, timeoutMs);
      const pending: Pending = { subject, timeoutMs: options.timeoutMs, resolve, reject, timer };
      this.pending.set(token, pending);
      pending.stopListening = options.cancellation?.onCancel((reason) => this.settle(token)?.reject(reason));
      try {
        this.nc.publish(subject, body, { reply: `${this.inbox}.${token}`, headers: h });
      } catch (error) {
        const maxPayload = error instanceof errors.InvalidArgumentError && error.message.includes("max_payload");
        this.settle(token)?.reject(maxPayload ? tooLarge(subject, size) : (error as Error));
      }
    });
  }

  /**
   * A request's reply token: unique (a counter) and unguessable (96 random bits). A participant sees
   * its own op's reply subject and may publish under the op-reply prefix (its answers): with a
   * counter alone it could answer the next op, sent to another participant, in that one's place.
   */
  private replyToken(): string {
    if (this.randomAt >= this.random.length) {
      this.random = randomBytes(12 * 256);
      this.randomAt = 0;
    }
    const bits = this.random.toString("base64url", this.randomAt, (this.randomAt += 12));
    return `${(++this.seq).toString(36)}${bits}`;
  }

  private subscribe(): void {
    if (this.subscription && !this.subscription.isClosed()) return;
    this.subscription = this.nc.subscribe(`${this.inbox}.*`, { callback: (error, msg) => this.onReply(error, msg) });
    // A closed connection ends the subscription: nothing pending can be answered any more.
    void this.subscription.closed.then(() => this.failPending("closed"));
    this.watchDisconnects ??= this.failPendingOnDisconnect();
  }

  /**
   * A disconnect may lose the replies in flight (the server drops what it could not deliver), so
   * the requests waiting for them are unknown outcomes at once, for the caller to retry
   * idempotently, rather than when their timers fire: a controller op sent without a deadline waits
   * as long as the coordinator may run it.
   */
  private async failPendingOnDisconnect(): Promise<void> {
    for await (const status of this.nc.status()) if (status.type === "disconnect") this.failPending("lost");
  }

  private failPending(how: "lost" | "closed"): void {
    for (const token of [...this.pending.keys()]) {
      const p = this.settle(token);
      p?.reject(new ConnectionLostFailure(p.subject, how));
    }
  }

  private onReply(error: Error | null, msg: Msg): void {
    if (error) return; // e.g. a permissions violation on the inbox: the requests time out as unknown outcomes
    const p = this.settle(msg.subject.slice(this.inbox.length + 1));
    if (!p) return; // a late reply to a request that already timed out
    if (msg.data.length === 0 && decodedHeaders(msg)?.code === NO_RESPONDERS) p.reject(new NoRespondersFailure(p.subject));
    else p.resolve(msg.string());
  }

  private settle(token: string): Pending | undefined {
    const p = this.pending.get(token);
    if (!p) return undefined;
    this.pending.delete(token);
    clearTimeout(p.timer);
    p.stopListening?.();
    return p;
  }
}
