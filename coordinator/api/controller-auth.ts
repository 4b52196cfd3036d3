import { CheckpointError, bearerToken, tokensEqual } from "../../protocol/index.js";

/**
 * Checks an `Authorization: Bearer <token>` header value against the controller token. The
 * comparison hashes both sides and uses crypto.timingSafeEqual on the equal-length digests.
 */
export function authorizeController(header: string | undefined | null, expected: string): void {
  const presented = bearerToken(header);
  if (presented === undefined || !tokensEqual(presented, expected)) {
    throw new CheckpointError("unauthorized", "missing or wrong bearer token");
  }
}
