/** Connection errors that mean an HTTP request never left: nothing serves at that address, or it could not be reached. */
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "UND_ERR_CONNECT_TIMEOUT"]);

/**
 * The code of a fetch failure that proves the request was never sent (no connection was made), or
 * undefined: a reset or timeout after connecting may have cut off a request the server acted on.
 * (A host with several addresses fails with Node's AggregateError, which carries the first one's code.)
 */
export function neverSentCode(error: unknown): string | undefined {
  const code = ((error as { cause?: { code?: unknown } } | null)?.cause)?.code;
  return typeof code === "string" && NOT_SENT.has(code) ? code : undefined;
}
