/** Version of the control messages on the wire; bumped on any incompatible change. */
export const PROTOCOL_VERSION = 1;

/** Version of `manifest.json` and `checkpoint.json`; readers refuse any other. */
export const MANIFEST_SCHEMA_VERSION = 1;

/** NATS' default max_payload. Control messages must stay well under it: records never travel on the bus. */
export const MAX_CONTROL_MESSAGE_BYTES = 1024 * 1024;

/**
 * The furthest ahead a deadline may lie (seconds). Longer ones are refused (`invalid_request`):
 * usually milliseconds sent as seconds, and past ~24.8 days timers overflow and fire at once.
 */
export const MAX_DEADLINE_AHEAD_S = 7 * 24 * 3600;

/** The longest delay a Node timer holds (2^31-1 ms, ~24.8 days): setTimeout fires a longer one at once. */
export const MAX_TIMER_MS = 2 ** 31 - 1;

/** A delay setTimeout honours: at least 1 ms, at most MAX_TIMER_MS. */
export function timerDelay(ms: number): number {
  return Math.min(Math.max(1, Math.ceil(ms)), MAX_TIMER_MS);
}
