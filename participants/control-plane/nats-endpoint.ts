import { context, type Context } from "@opentelemetry/api";
import { Match, type Msg, type NatsConnection, type Subscription } from "@nats-io/transport-node";
import type { Logger } from "pino";
import { replyBudget, respondWithinMaxPayload } from "../../protocol/nats-reply.js";
import {
  BearerTokenSchema,
  CONTROL_MESSAGES,
  CheckpointError,
  DeploymentSchema,
  HEADER_AUTHORIZATION,
  HEADER_SENT_AT,
  decodedHeaders,
  OPS,
  bearerToken,
  decodeRequest,
  encodeMessage,
  encodeReply,
  parseName,
  parseSentAt,
  participantSubject,
  toCheckpointError,
  tokensEqual,
  type CommitReply,
  type Op,
  type RecordBase,
} from "../../protocol/index.js";
import { fitCommitReply } from "./commit-reply.js";
import { countRefusal } from "../telemetry/instruments.js";
import { extractTraceContext } from "../telemetry/nats-propagation.js";
import type { ParticipantControlPlane } from "./control-plane.js";

export interface ControlEndpointOptions {
  nc: NatsConnection;
  deployment: string;
  token: string;
  logger?: Logger;
}

/**
 * Serves a control plane on the participant's own subjects, one per op. Each request is
 * authenticated (bearer token, constant-time), decoded strictly (no key twice, no rounded integer), and handled concurrently so a
 * prepare waiting for readiness never delays the resume that aborts it.
 */
export class ControlEndpoint {
  private readonly subscriptions: Subscription[] = [];
  private readonly inFlight = new Set<Promise<void>>();
  private stopped = false;

  constructor(
    private readonly plane: ParticipantControlPlane<RecordBase>,
    private readonly options: ControlEndpointOptions,
  ) {
    // Refused here, not at the first request: a token bearerToken cannot read back never authenticates.
    const token = BearerTokenSchema.safeParse(options.token);
    if (!token.success) throw new CheckpointError("invalid_request", `a participant's control token: ${token.error.issues[0]!.message}`);
    // One subject token: a `*` or `>` would subscribe (and answer) other deployments' participants.
    parseName(DeploymentSchema, options.deployment, "a participant's deployment");
  }

  start(): void {
    for (const op of OPS) {
      const subject = participantSubject(this.options.deployment, this.plane.adapter.kind, this.plane.instance, op);
      const sub = this.options.nc.subscribe(subject);
      this.subscriptions.push(sub);
      void (async () => {
        for await (const msg of sub) {
          // nats.js still yields messages queued before the unsubscribe: a stopped endpoint (or
          // one that lost its name) answers nothing more.
          if (this.stopped) break;
          const task = this.answer(op, msg);
          this.inFlight.add(task);
          // answer() settles every failure into a reply; a rejection here must still not end the process.
          void task.catch((err: unknown) => this.options.logger?.error({ op, err }, "control answer failed")).finally(() => this.inFlight.delete(task));
        }
      })().catch((err: unknown) => {
        // The server refused the subscription (a NATS permission list without this subject): nats.js
        // ends the iterator with that error. Unhandled, it would end the Gym server; the coordinator
        // finds this op unreachable (no responders) and names this participant.
        this.options.logger?.error({ op, err }, "control_subscription_failed");
      });
    }
  }

  /** The coordinator's trace context is active for the whole answer: lines logged outside the op's span carry its trace_id too. */
  private answer(op: Op, msg: Msg): Promise<void> {
    const parent = extractTraceContext(decodedHeaders(msg));
    return context.with(parent, () => this.answerIn(op, msg, parent));
  }

  private async answerIn(op: Op, msg: Msg, parent: Context): Promise<void> {
    let body: string;
    let refusal: CheckpointError | undefined;
    try {
      // Header names are case-insensitive, as over HTTP: `authorization: Bearer …` authenticates too.
      const token = bearerToken(decodedHeaders(msg)?.get(HEADER_AUTHORIZATION, Match.IgnoreCase));
      if (token === undefined || !tokensEqual(token, this.options.token)) {
        throw new CheckpointError("unauthorized", "missing or wrong bearer token");
      }
      // As the controller APIs decode: a key named twice or an integer JSON.parse would round is
      // refused before the control plane sees anything (a coordinator's JSON.stringify sends neither).
      const request = decodeRequest(CONTROL_MESSAGES[op].request, msg.data);
      // Advisory: an absent or unreadable send time (an older coordinator) is ignored, never refused.
      const sentAtMs = parseSentAt(decodedHeaders(msg)?.get(HEADER_SENT_AT, Match.IgnoreCase));
      const reply = await this.plane.handle(op, request as never, parent, sentAtMs);
      // A commit's episode list is left out past the server's max_payload too, when a deployment
      // configures it below 1 MiB (the coordinator reads it from the committed records).
      body = encodeReply(op === "commit" ? fitCommitReply(reply as CommitReply, replyBudget(this.options.nc)) : reply, op);
    } catch (error) {
      refusal = toCheckpointError(error);
      // The endpoint's own refusals (token, decoding) are answered on the control subjects too;
      // one the control plane already counted counts once (countRefusal dedupes by error object).
      countRefusal(error, this.plane.adapter.kind);
      if (refusal.code === "internal_error") this.options.logger?.error({ op, err: error }, "control operation failed");
      body = encodeMessage(refusal.toReply());
    }
    if (!msg.reply) return;
    const tooLarge = respondWithinMaxPayload(msg, body, op, this.options.nc.info?.max_payload, refusal);
    if (tooLarge) countRefusal(tooLarge, this.plane.adapter.kind);
  }

  /** Stops serving; waits for answers already being computed. */
  async stop(): Promise<void> {
    this.stopped = true;
    for (const sub of this.subscriptions) sub.unsubscribe();
    this.subscriptions.length = 0;
    await Promise.allSettled([...this.inFlight]);
  }
}
