import { injectTraceContext } from "../telemetry/nats-trace-headers.js";
import { NoRespondersError, RequestError, TimeoutError, headers, type NatsConnection } from "@nats-io/transport-node";
import { CheckpointError, HEADER_AUTHORIZATION, controllerSubject, type ControllerOp, type CtlReplyOf, type CtlRequestInputOf } from "../../protocol/index.js";
import { ControllerClient } from "./controller-client.js";
import { decodeControllerReply, replyTimeoutMs } from "./reply-decoder.js";

export interface NatsControllerClientOptions {
  nc: NatsConnection;
  deployment: string;
  token: string;
  /** Reply timeout of ops without a deadline (default 90 s: above the coordinator's default op timeout). */
  timeoutMs?: number;
  slackMs?: number;
  /** How long to retry while no coordinator is the ready leader (no responders / not_leader). */
  leaderWaitMs?: number;
}

/** The controller API over NATS request/reply on `controllerSubject(deployment, op)`. */
export class NatsControllerClient extends ControllerClient {
  constructor(private readonly options: NatsControllerClientOptions) {
    super();
  }

  async call<O extends ControllerOp>(op: O, request: CtlRequestInputOf<O>): Promise<CtlReplyOf<O>> {
    const subject = controllerSubject(this.options.deployment, op);
    const body = JSON.stringify(request);
    const waitUntil = Date.now() + (this.options.leaderWaitMs ?? 10_000);
    for (;;) {
      const h = headers();
      h.set(HEADER_AUTHORIZATION, `Bearer ${this.options.token}`);
      // The controller's own span (if any) becomes the parent of the coordinator's.
      injectTraceContext(h);
      const timeout = replyTimeoutMs(request, this.options.timeoutMs ?? 90_000, this.options.slackMs ?? 10_000);
      try {
        const msg = await this.options.nc.request(subject, body, { timeout: Math.max(1, Math.ceil(timeout)), headers: h });
        return decodeControllerReply(op, msg.string());
      } catch (error) {
        const noLeader =
          (error instanceof RequestError && error.isNoResponders()) ||
          error instanceof NoRespondersError ||
          (error instanceof CheckpointError && error.code === "not_leader");
        if (noLeader && Date.now() < waitUntil) {
          await new Promise((resolve) => setTimeout(resolve, 100));
          continue;
        }
        if (noLeader && !(error instanceof CheckpointError)) throw new CheckpointError("not_leader", `no coordinator serves ${subject}`);
        if (error instanceof TimeoutError) throw new CheckpointError("outcome_unknown", `no reply on ${subject} within ${Math.round(timeout)} ms`);
        throw error;
      }
    }
  }
}
