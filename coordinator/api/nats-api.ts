import { context } from "@opentelemetry/api";
import { Match, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { replyBudget, respondWithinMaxPayload } from "../../protocol/nats-reply.js";
import {
  CheckpointError,
  CONTROLLER_OP_NAMES,
  HEADER_AUTHORIZATION,
  NATS_INBOX_PREFIXES,
  NATS_OP_REPLY_PREFIX,
  decodedHeaders,
  controllerSubject,
  encodeMessage,
  toCheckpointError,
  type ControllerOp,
} from "../../protocol/index.js";
import type { CheckpointEngine } from "../engine/checkpoint-engine.js";
import { authorizeController } from "./controller-auth.js";
import { dispatchController } from "./controller-dispatch.js";
import { encodeControllerReply } from "./reply-budget.js";
import { extractTraceContext } from "../telemetry/nats-trace-headers.js";

export interface NatsControllerApiOptions {
  nc: NatsConnection;
  deployment: string;
  token: string;
  engine: CheckpointEngine;
  /**
   * Whether this coordinator answers now (the daemon: it is the ready leader). Every subscribed
   * coordinator gets every request; one that is not the ready leader (a frozen leader that woke
   * with its lease expired) stays silent, so its refusal cannot race the real leader's answer and
   * make the controller retry an op that is running. Default: always.
   */
  answering?: () => boolean;
  logger?: Logger;
}

/** Inboxes that are not a controller's: the coordinator's own (its JetStream calls, its participant ops) and the participants'. */
const NOT_CONTROLLER_INBOXES = new Set<string>([NATS_INBOX_PREFIXES.coordinator, NATS_OP_REPLY_PREFIX, NATS_INBOX_PREFIXES.gym]);

/**
 * Whether the coordinator may answer on `reply`: a subject under an inbox prefix (a first token
 * `_INBOX…`: the controllers' `_INBOX_gym_ckpt_controller`, nats.js's and the nats CLI's `_INBOX`),
 * not the coordinator's or the participants' own. The answer is published with the coordinator's
 * permissions, which cover the leader lease, the decision journal, their purges and every
 * participant op: a request naming `$JS.API.STREAM.PURGE.KV_gym_ckpt_<deployment>_journal` as its
 * reply subject would have the journal purged by the answer, whatever the answer says.
 */
export function isControllerReplySubject(reply: string): boolean {
  const first = reply.split(".", 1)[0]!;
  return first.startsWith("_INBOX") && reply.length > first.length + 1 && !NOT_CONTROLLER_INBOXES.has(first);
}

/**
 * The controller API on NATS: request/reply on `controllerSubject(deployment, op)`, one subject per
 * op, bearer token in the Authorization header. Only the ready leader serves it (the daemon starts
 * and stops this API with leadership), so a controller that sees no responders knows no coordinator
 * is active yet. No queue group: a leader that froze (a stalled VM, a blocked event loop) keeps its
 * subscriptions at the server until its connection times out, and a group would keep sending it a
 * share of the requests, which would time out although a ready successor serves. With plain
 * subscriptions both get each request; the successor answers, and a frozen leader that wakes finds
 * its lease expired and stays silent (`answering`), leaving the request to the successor.
 */
export class NatsControllerApi {
  private readonly subs: Subscription[] = [];
  private readonly inFlight = new Set<Promise<void>>();

  constructor(private readonly options: NatsControllerApiOptions) {}

  get serving(): boolean {
    return this.subs.length > 0;
  }

  /** Subscribes, and resolves once the server has the subscriptions (so "ready" means served). */
  async start(): Promise<void> {
    if (this.subs.length) return;
    for (const op of CONTROLLER_OP_NAMES) {
      const sub = this.options.nc.subscribe(controllerSubject(this.options.deployment, op));
      this.subs.push(sub);
      void (async () => {
        for await (const msg of sub) {
          // nats.js still yields what the subscription had queued when it was unsubscribed; stop()
          // no longer waits for those, so they would run under a daemon releasing its lease.
          if (!this.subs.includes(sub)) break;
          const task = this.answer(op, msg);
          this.inFlight.add(task);
          // answer() settles every failure into a reply; a rejection here must still not end the process.
          void task.catch((err: unknown) => this.options.logger?.error({ op, err }, "controller answer failed")).finally(() => this.inFlight.delete(task));
        }
      })().catch((err: unknown) => {
        // The server refused the subscription (a NATS permission list without this subject): nats.js
        // ends the iterator with that error. Unhandled, it would end the daemon; its other subjects
        // and the HTTP API still serve, and controllers of this op get no responders (not_leader).
        this.options.logger?.error({ op, err }, "controller_api_subscription_failed");
      });
    }
    // A request published before the server processed the SUBs would reach only whoever else still
    // subscribes (a frozen predecessor) and time out; the flush's round trip orders them first.
    await this.options.nc.flush();
  }

  private async answer(op: ControllerOp, msg: Msg): Promise<void> {
    if (this.options.answering?.() === false) return;
    if (!msg.reply || !isControllerReplySubject(msg.reply)) {
      // Neither run nor answered: any answer there is a publish of the coordinator's, not a reply;
      // and an op nobody awaits (no reply subject, a `nats pub`) would change state unseen.
      const what = msg.reply ? `request's reply subject ${JSON.stringify(msg.reply)} is no controller's inbox (_INBOX…, not the coordinator's or the participants')` : "message has no reply subject (a publish, not a request)";
      const refusal = new CheckpointError("invalid_request", `the ${op} ${what}: neither run nor answered`);
      this.options.logger?.warn({ op, code: refusal.code, detail: refusal.message }, "controller_request_refused");
      return;
    }
    let body: string;
    let refusal: CheckpointError | undefined;
    try {
      // Header names are case-insensitive, as over HTTP: `authorization: Bearer …` authenticates too.
      const headers = decodedHeaders(msg);
      authorizeController(headers?.get(HEADER_AUTHORIZATION, Match.IgnoreCase), this.options.token);
      const parent = extractTraceContext(headers);
      const reply = await context.with(parent, () => dispatchController(this.options.engine, op, msg.data));
      // Lists are left out past one message (reply-budget.ts), or past the server's max_payload when
      // a deployment configures it lower: msg.respond would throw and the controller get no reply.
      // The HTTP API answers in full.
      body = encodeControllerReply(op, reply, replyBudget(this.options.nc));
    } catch (error) {
      refusal = toCheckpointError(error);
      if (refusal.code === "internal_error") this.options.logger?.error({ op, err: error }, "controller_op_internal_error");
      body = encodeMessage(refusal.toReply());
    }
    // The server's max_payload may have changed under us (a reconnect to another server), or be
    // below a refusal's detail: still an answer.
    respondWithinMaxPayload(msg, body, op, this.options.nc.info?.max_payload, refusal);
  }

  async stop(): Promise<void> {
    for (const sub of this.subs) sub.unsubscribe();
    this.subs.length = 0;
    await Promise.allSettled([...this.inFlight]);
  }
}
