import { errors, type Msg } from "@nats-io/transport-node";
import { encodeMessage } from "./codec.js";
import { CheckpointError } from "./errors.js";

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
