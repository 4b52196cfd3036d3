import { createHash, timingSafeEqual } from "node:crypto";
import { z } from "zod";

/**
 * A configured bearer token (participants' control token, controller token, cut token): one that
 * `bearerToken` can read back from `Authorization: Bearer <token>`. Whitespace ends the token there,
 * so a token holding any could never authenticate; control characters are no header's either.
 */
export const BearerTokenSchema = z
  .string()
  .min(1, "a token may not be empty")
  // Visible ASCII only: a header carries bytes, and clients encode other characters differently
  // (curl sends UTF-8, fetch latin1), so such a token would work from one client and not another.
  .regex(/^[\x21-\x7e]*$/, "a token must be visible ASCII: no whitespace, control or non-ASCII characters (`Authorization: Bearer <token>` carries it as bytes clients encode differently)");

/**
 * Constant-time comparison of a presented bearer token with the expected one. Both sides are
 * hashed first so lengths never leak and timingSafeEqual always sees equal-length inputs.
 */
export function tokensEqual(presented: string, expected: string): boolean {
  const a = createHash("sha256").update(presented).digest();
  const b = createHash("sha256").update(expected).digest();
  return timingSafeEqual(a, b) && presented.length === expected.length;
}

/** The token from an `Authorization: Bearer <token>` header value, or undefined. */
export function bearerToken(header: string | undefined | null): string | undefined {
  if (!header) return undefined;
  const match = /^Bearer\s+(\S+)\s*$/i.exec(header);
  return match?.[1];
}
