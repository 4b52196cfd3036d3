import { context } from "@opentelemetry/api";
import { errors, type NatsConnection } from "@nats-io/transport-node";
import { CheckpointError, controllerSubject, leaderOfOtherVersion, within, type ControllerOp, type FirstConnectFailure, type CtlReplyOf, type CtlRequestInputOf } from "../../protocol/index.js";
import { Cancellation } from "../engine/cancellation.js";
import { NatsParticipantTransport } from "../engine/nats-transport.js";
import { ConnectionLostFailure, NoRespondersFailure, RequestTimeoutFailure } from "../engine/transport.js";
import { ControllerClient } from "./controller-client.js";
import { LEASE_READ_BOUND_MS, LeaderLeaseReader } from "./leader-watch.js";
import { decodeControllerReply, replyTimeoutMs } from "./reply-decoder.js";

/** A controller's NATS connection that cannot be made: no coordinator could be asked, as the HTTP client says of one it cannot reach. */
export const CONTROLLER_CONNECT_FAILURE: FirstConnectFailure = { unreachable: "not_leader", consequence: "no coordinator can be asked; nothing was sent" };

export interface NatsControllerClientOptions {
  nc: NatsConnection;
  deployment: string;
  token: string;
  /**
   * Reply timeout of a request without `deadline_ts`. Default: 90 s for ops that take no deadline;
   * an op that takes one waits as long as the coordinator's `default_timeout_ms` may be (`replyTimeoutMs`).
   */
  timeoutMs?: number;
  /** Wait past a request's deadline (default 10 s). */
  slackMs?: number;
  /** How long to retry while no coordinator is the ready leader (no responders / not_leader). */
  leaderWaitMs?: number;
  /**
   * An op waits for its reply (see `timeoutMs`, `slackMs`) unless the coordinator that took it
   * stops leading: its lease is re-read this often while it waits (default: the lease period, the
   * leader bucket's max_age, at most 5 s).
   */
  leaderCheckMs?: number;
}

/** The controller API over NATS request/reply on `controllerSubject(deployment, op)`. */
export class NatsControllerClient extends ControllerClient {
  /** The coordinator's own request path (one shared reply subscription, no Error built per request). */
  private readonly transport: NatsParticipantTransport;
  private readonly leases: LeaderLeaseReader;

  constructor(private readonly options: NatsControllerClientOptions) {
    super();
    this.transport = new NatsParticipantTransport(options.nc);
    this.leases = new LeaderLeaseReader(options.nc, options.deployment);
  }

  async call<O extends ControllerOp>(op: O, request: CtlRequestInputOf<O>): Promise<CtlReplyOf<O>> {
    const subject = controllerSubject(this.options.deployment, op);
    const body = JSON.stringify(request);
    // A duration within this process: a wall-clock step must neither end the leader wait nor stretch it.
    const waitUntil = performance.now() + (this.options.leaderWaitMs ?? 10_000);
    for (;;) {
      const timeout = replyTimeoutMs(op, request, this.options);
      // Every wait is watched, a deadline's too: a collector whose leader died mid-commit would
      // otherwise wait out the deadline (60 s by default) with the Gym paused, while a successor
      // that could answer its retry is ready within a few seconds.
      const watch = new AbortController();
      const cancellation = new Cancellation(); // the request's own: the transport takes no AbortSignal
      try {
        // The lease is read beside the request, not before it: one KV round trip off the op's path
        // (none when a read within the last LEASE_READ_REUSE_MS named a serving leader).
        const everyMs = () => this.options.leaderCheckMs ?? this.leases.checkEveryMs();
        const lost = this.leases.watchOp(watch.signal, everyMs);
        const reply = this.transport.request(subject, body, { timeoutMs: timeout, token: this.options.token, context: context.active(), cancellation });
        void lost.then((error) => cancellation.cancel(error));
        // The controller's own span (if any) becomes the parent of the coordinator's.
        return decodeControllerReply(op, await reply);
      } catch (error) {
        // nats.js refused to send on a connection closed or draining (thrown before anything left):
        // no coordinator can be asked through it, now or later, so not retried.
        if (error instanceof errors.ClosedConnectionError || error instanceof errors.DrainingConnectionError) {
          const how = error instanceof errors.ClosedConnectionError ? "closed" : "draining";
          throw new CheckpointError("not_leader", `the controller's NATS connection is ${how}: no coordinator can be asked through it; nothing was sent on ${subject}`);
        }
        const noLeader = error instanceof NoRespondersFailure || (error instanceof CheckpointError && error.code === "not_leader");
        if (noLeader && performance.now() < waitUntil) {
          await new Promise((resolve) => setTimeout(resolve, 100));
          continue;
        }
        if (noLeader) throw await this.namingOtherVersionLeader(error instanceof CheckpointError ? error : new CheckpointError("not_leader", `no coordinator serves ${subject}`));
        if (error instanceof ConnectionLostFailure) throw new CheckpointError("outcome_unknown", `${error.message} (the op may have run)`);
        if (error instanceof RequestTimeoutFailure) throw new CheckpointError("outcome_unknown", `no reply on ${subject} within ${Math.round(timeout)} ms`);
        throw error;
      } finally {
        watch.abort(new Error("the reply came"));
      }
    }
  }

  /**
   * `refusal` (nobody served) naming the lease holder when it speaks another protocol version: it
   * serves that version's subjects, so the wait could never end here. Unread within its bound: as it is.
   */
  private async namingOtherVersionLeader(refusal: CheckpointError): Promise<CheckpointError> {
    // Stopped at the bound too, so nothing of the read outlives the answer (a process closing after it).
    const stop = AbortSignal.timeout(LEASE_READ_BOUND_MS);
    const other = leaderOfOtherVersion(await within(this.leases.leader(stop), LEASE_READ_BOUND_MS).catch(() => undefined));
    return other === undefined ? refusal : new CheckpointError("not_leader", `${refusal.message}: ${other}`, { cause: refusal });
  }
}
