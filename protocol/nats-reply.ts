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
 * Sends the reply to a request: `body`, or when it is a refusal, `refusal` (whose reply `body` is).
 * A body within the 1 MiB control-message limit can still exceed the server's `max_payload` (a
 * deployment configuring it lower, or a reconnect to such a server): nats.js then refuses to send
 * it, and without any answer the requester would wait for its timeout and take the op for an
 * unknown outcome. An op's result is answered `reply_too_large` instead (the op ran), returned so
 * the caller can count it. A refusal keeps its code, its detail cut to fit (`refusalWithin`):
 * `reply_too_large` would say the op ran when it was refused, and a refusal's detail (up to 4096
 * characters) passes a max_payload of a few KiB. Shared by the participants' control endpoint and
 * the coordinator's NATS controller API.
 */
export function respondWithinMaxPayload(msg: Msg, body: string, op: string, maxPayload: number | undefined, refusal?: CheckpointError): CheckpointError | undefined {
  try {
    msg.respond(body);
    return undefined;
  } catch (error) {
    if (!(error instanceof errors.InvalidArgumentError && error.message.includes("max_payload"))) throw error;
    const limit = maxPayload ?? MAX_CONTROL_MESSAGE_BYTES;
    const tooLarge = refusal ? undefined : new CheckpointError("reply_too_large", `${op} ran, but its ${Buffer.byteLength(body)}-byte reply exceeds the NATS server's max_payload (${limit} bytes)`);
    const fitted = refusalWithin(refusal ?? tooLarge!, limit);
    // A max_payload below even an empty refusal (under ~100 bytes): nothing can be answered.
    if (fitted === undefined) throw error;
    msg.respond(fitted);
    return tooLarge;
  }
}

/**
 * `refusal`'s reply in at most `maxPayload` bytes: its detail cut (at a character, saying how long
 * it was and why) to fit the server's max_payload, else emptied; undefined when not even that fits.
 */
export function refusalWithin(refusal: CheckpointError, maxPayload: number): string | undefined {
  const full = encodeMessage(refusal.toReply());
  if (Buffer.byteLength(full) <= maxPayload) return full;
  const detail = refusal.message;
  const note = `… (${detail.length} characters; the NATS server's max_payload is ${maxPayload} bytes)`;
  const withDetail = (text: string) => JSON.stringify({ error: { code: refusal.code, detail: text } });
  const fits = (text: string) => Buffer.byteLength(withDetail(text)) <= maxPayload;
  // The longest start of the detail that fits with the note: the JSON grows with every character kept.
  let [low, high] = [-1, detail.length];
  while (high - low > 1) {
    const mid = (low + high) >> 1;
    if (fits(detail.slice(0, mid) + note)) low = mid;
    else high = mid;
  }
  if (low >= 0) {
    // Never half a surrogate pair.
    const kept = /[\uD800-\uDBFF]$/.test(detail.slice(0, low)) ? low - 1 : low;
    return withDetail(detail.slice(0, kept) + note);
  }
  return fits("") ? withDetail("") : undefined;
}
