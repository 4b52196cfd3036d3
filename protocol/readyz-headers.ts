/**
 * The coordinator that answered a `/readyz`, ready (200) or not (503): behind a load balancer in
 * front of several, a client watching an op tells the one that took it (whose refusal ends the op's
 * wait) from a standby (whose refusal says nothing about the op). Headers, not body fields, so the
 * bodies stay as they were and clients that read them strictly (an `HttpControllerClient` from before
 * these headers tells the API's refusal from a proxy's by its exact `{"error":…}` shape) are unaffected.
 */
export const HEADER_COORDINATOR_ID = "Gym-Coordinator-Id";
/** The leadership term the answering coordinator holds: on every 200, on a 503 only while it holds one. */
export const HEADER_COORDINATOR_EPOCH = "Gym-Coordinator-Epoch";
/**
 * `1` beside the epoch header when the term it names has served the controller API (its lease marked
 * serving, or this HTTP API answering ops in it: it does once the term recovered, a few ms before the
 * lease is marked, which never happens if the NATS API's subscribe fails or a stop begins first):
 * a 503 then comes from a leader stopping gracefully (it answers the ops under way before it
 * lets the lease go) or whose renewal lapsed (it serves again once one lands), which may hold the op,
 * not from a new leader waiting out its first lease period or recovering. Absent from a coordinator
 * before it: its refusals naming a term count as a term that did not serve yet.
 */
export const HEADER_COORDINATOR_SERVED = "Gym-Coordinator-Served";

/**
 * The id header's value: percent-encoded as `encodeURIComponent` does, since a configured
 * `coordinator_id` may hold characters no header value can (non-ASCII, control characters).
 */
export function formatCoordinatorIdHeader(id: string): string {
  return encodeURIComponent(id);
}

/** The id a header value names, or undefined (absent: a coordinator before the header; or not decodable). */
export function parseCoordinatorIdHeader(value: string | null | undefined): string | undefined {
  if (!value) return undefined;
  try {
    return decodeURIComponent(value);
  } catch {
    return undefined;
  }
}

/** The term an epoch header names (digits, a KV revision), or undefined (absent: no term held, or a coordinator before the header). */
export function parseCoordinatorEpochHeader(value: string | null | undefined): number | undefined {
  if (!value || !/^[0-9]{1,15}$/.test(value)) return undefined;
  return Number(value);
}
