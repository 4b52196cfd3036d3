/** The gym-ckpt release (package.json's version, held to it by a test): `--version` and every daemon's start line name it. */
export const PACKAGE_VERSION = "0.1.0";

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

/**
 * Why a peer's message naming another protocol version (a status reply, a membership announcement)
 * is not read as this version's, naming both; undefined for this version's or one naming none.
 */
export function protocolVersionMismatch(value: unknown, who: string): string | undefined {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return undefined;
  const version = (value as { protocol_version?: unknown }).protocol_version;
  if (typeof version !== "number" || version === PROTOCOL_VERSION) return undefined;
  const side = version > PROTOCOL_VERSION ? "a newer" : "an older";
  return `${who} speaks protocol version ${version} (${side} gym-ckpt); this one speaks protocol version ${PROTOCOL_VERSION} only: run coordinators and participants of one protocol version`;
}
