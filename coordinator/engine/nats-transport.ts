import { NoRespondersError, RequestError, TimeoutError, headers, type NatsConnection } from "@nats-io/transport-node";
import { HEADER_AUTHORIZATION } from "../../protocol/index.js";
import { injectTraceContext } from "../telemetry/nats-trace-headers.js";
import { NoRespondersFailure, RequestTimeoutFailure, type ParticipantTransport, type TransportRequestOptions } from "./transport.js";

/** Core NATS request/reply with the bearer token and W3C trace context in the headers. */
export class NatsParticipantTransport implements ParticipantTransport {
  constructor(private readonly nc: NatsConnection) {}

  async request(subject: string, body: string, options: TransportRequestOptions): Promise<string> {
    const h = headers();
    h.set(HEADER_AUTHORIZATION, `Bearer ${options.token}`);
    if (options.context) injectTraceContext(h, options.context);
    try {
      const msg = await this.nc.request(subject, body, { timeout: Math.max(1, Math.ceil(options.timeoutMs)), headers: h });
      return msg.string();
    } catch (error) {
      if (error instanceof TimeoutError) throw new RequestTimeoutFailure(subject, options.timeoutMs);
      if (error instanceof RequestError && (error.cause instanceof NoRespondersError || error.isNoResponders())) {
        throw new NoRespondersFailure(subject);
      }
      if (error instanceof NoRespondersError) throw new NoRespondersFailure(subject);
      // Disconnected while the request was in flight: the participant may or may not have acted.
      if (error instanceof RequestError) throw new RequestTimeoutFailure(subject, options.timeoutMs);
      throw error;
    }
  }
}
