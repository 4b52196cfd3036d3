/**
 * Server-sent-events framing, just enough for the attach proxy to withhold a stream's final event
 * until the ledger row is written without delaying the events before it.
 */

/**
 * Where the stream's last event begins: just after the last blank line that has a further event
 * line after it (an event begins with its first non-blank line), or 0 when the bytes hold one event
 * only. A trailing blank line (the end of a complete event) does not start a next one.
 */
export function lastEventStart(bytes: Buffer): number {
  const lastContent = lastContentByte(bytes);
  if (lastContent < 2) return 0;
  // `\n\n`, `\r\n\r\n` (matched by its `\n\r\n`) or `\r\r` (lines may end in a bare CR), ending
  // at or before the last event line's first byte.
  const lf = bytes.lastIndexOf("\n\n", lastContent - 2);
  const crlf = lastContent >= 3 ? bytes.lastIndexOf("\n\r\n", lastContent - 3) : -1;
  const cr = bytes.lastIndexOf("\r\r", lastContent - 2);
  return Math.max(lf === -1 ? 0 : lf + 2, crlf === -1 ? 0 : crlf + 3, cr === -1 ? 0 : cr + 2);
}

/** The bytes hold one event up to its dispatching blank line: a client has it whole. */
export function isCompleteEvent(event: Buffer): boolean {
  const end = event.length;
  return lastContentByte(event) >= 0 && (event.lastIndexOf("\n\n") === end - 2 || event.lastIndexOf("\n\r\n") === end - 3 || event.lastIndexOf("\r\r") === end - 2);
}

/**
 * Markers of an event a stream may end with, and a client may stop reading at: `data: [DONE]`
 * (openai-python closes the connection there, before the terminating chunk), the Responses API's
 * `response.completed` / `response.failed` / `response.incomplete`, the Messages API's `message_stop`,
 * and error events. Matched as substrings: a false match (the word inside a JSON string is escaped,
 * `\"error\"`, so it rarely happens) only makes that one event wait for the next.
 */
const FINAL_MARKERS = ["[DONE]", '"error"', "event: error", "event:error", "response.completed", "response.failed", "response.incomplete", "message_stop"];

/** The event may be the stream's last one (see FINAL_MARKERS). */
export function mayEndStream(event: Buffer): boolean {
  return FINAL_MARKERS.some((marker) => event.includes(marker));
}

function lastContentByte(bytes: Buffer): number {
  let at = bytes.length - 1;
  while (at >= 0 && (bytes[at] === LF || bytes[at] === CR)) at -= 1;
  return at;
}

const LF = 0x0a;
const CR = 0x0d;
