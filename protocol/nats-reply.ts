import { errors, type Msg, type NatsConnection } from "@nats-io/transport-node";
import { encodeMessage } from "./codec.js";
import { CheckpointError } from "./errors.js";
import { MAX_CONTROL_MESSAGE_BYTES } from "./version.js";

/**
 * What one reply may hold: the control-message limit, or the server's `max_payload` when a
 * deployment configures it lower (read at each reply: a reconnect may reach another server).
 * Shared by the participants' control endpoint and the coordinator's NATS controller API.
 */
export function replyBudget(nc: Pick<NatsConnection, "info">): number {
  const maxPayload = nc.info?.max_payload;
  return typeof maxPayload === "number" && maxPayload > 0 ? Math.min(MAX_CONTROL_MESSAGE_BYTES, maxPayload) : MAX_CONTROL_MESSAGE_BYTES;
}

/**
 * Sends the reply to a request whose op already ran. A body within the 1 MiB control-message limit
 * can still exceed the server's `max_payload` (a deployment configuring it lower, or a reconnect to
 * such a server): nats.js then refuses to send it, and without any answer the requester would wait
 * for its timeout and take the op for an unknown outcome. That reply is `reply_too_large` instead,
 * returned so the caller can count it. Shared by the participants' control endpoint and the
 * coordinator's NATS controller API.
 */
export function respondWithinMaxPayload(msg: Msg, body: string, op: string, maxPayload: number | undefined): CheckpointError | undefined {
  try {
    msg.respond(body);
    return undefined;
  } catch (error) {
    if (!(error instanceof errors.InvalidArgumentError && error.message.includes("max_payload"))) throw error;
    const tooLarge = new CheckpointError("reply_too_large", `${op} ran, but its ${Buffer.byteLength(body)}-byte reply exceeds the NATS server's max_payload (${maxPayload ?? "unknown"} bytes)`);
    msg.respond(encodeMessage(tooLarge.toReply()));
    return tooLarge;
  }
}
