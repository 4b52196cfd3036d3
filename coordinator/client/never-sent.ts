/** Connection errors that mean an HTTP request never left: nothing serves at that address, or it could not be reached. */
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "UND_ERR_CONNECT_TIMEOUT"]);

/**
 * The code of a fetch failure that proves the request was never sent (no connection was made), or
 * undefined: a reset or timeout after connecting may have cut off a request the server acted on.
 */
export function neverSentCode(error: unknown): string | undefined {
  const cause = (error as { cause?: unknown } | null)?.cause as { code?: unknown; errors?: unknown } | undefined;
  if (typeof cause?.code === "string") return NOT_SENT.has(cause.code) ? cause.code : undefined;
  // A host name with several addresses (happy eyeballs): an AggregateError, every address refused.
  const errors = Array.isArray(cause?.errors) ? (cause.errors as { code?: unknown }[]) : [];
  const codes = errors.map((e) => e?.code);
  return codes.length > 0 && codes.every((code) => typeof code === "string" && NOT_SENT.has(code)) ? (codes[0] as string) : undefined;
}
