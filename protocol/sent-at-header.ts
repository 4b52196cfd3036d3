/**
 * `Gym-Sent-At`: the coordinator's clock (ms since the Unix epoch) when it sent a control op. A
 * participant compares it with its own clock to diagnose clock skew, which absolute deadlines and
 * leases do not tolerate. Advisory only: an absent or unreadable value is ignored, never refused
 * (coordinators before it send none), and it is a header, not a body field, so it is
 * wire-compatible both ways.
 */
export const HEADER_SENT_AT = "Gym-Sent-At";

/**
 * The instants a coordinator's clock can plausibly read (2000 to 2200): a garbled value outside
 * them is ignored rather than reported as decades of skew.
 */
const MIN_SENT_AT_MS = Date.UTC(2000, 0, 1);
const MAX_SENT_AT_MS = Date.UTC(2200, 0, 1);

/** The header's value for an instant: whole milliseconds, digits only. */
export function formatSentAt(ms: number): string {
  return String(Math.floor(ms));
}

/** The instant a header value names, or undefined unless it is plain digits (at most 16) within the plausible range. */
export function parseSentAt(value: string | undefined): number | undefined {
  if (value === undefined || !/^[0-9]{1,16}$/.test(value)) return undefined;
  const ms = Number(value);
  return ms >= MIN_SENT_AT_MS && ms < MAX_SENT_AT_MS ? ms : undefined;
}
