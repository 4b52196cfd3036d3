import { createHash, timingSafeEqual } from "node:crypto";

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
