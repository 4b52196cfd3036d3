/** Connection errors that mean an HTTP request never left: nothing serves at that address, or it could not be reached. */
const NOT_SENT = new Set(["ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "UND_ERR_CONNECT_TIMEOUT"]);

/**
 * This process (EMFILE) or the host (ENFILE) has no file descriptor left. Never sent only when the
 * connect failed so: the socket could not be made. (Measured on Node 20: fetch fails with cause
 * { code: "EMFILE", syscall: "connect" }; nothing after a connection is made opens a descriptor.)
 */
const NO_DESCRIPTOR = new Set(["EMFILE", "ENFILE"]);

/** Codes of errors that mean this process is out of file descriptors, not that the server is away. */
export function outOfDescriptors(code: string): boolean {
  return NO_DESCRIPTOR.has(code);
}

/**
 * The code of a fetch failure that proves the request was never sent (no connection was made), or
 * undefined: a reset or timeout after connecting may have cut off a request the server acted on.
 * (A host with several addresses fails with Node's AggregateError, which carries the first one's code.)
 */
export function neverSentCode(error: unknown): string | undefined {
  const cause = (error as { cause?: { code?: unknown; syscall?: unknown; errors?: { syscall?: unknown }[] } } | null)?.cause;
  const code = cause?.code;
  if (typeof code !== "string") return undefined;
  if (NOT_SENT.has(code)) return code;
  const syscall = cause?.syscall ?? (Array.isArray(cause?.errors) ? cause.errors[0]?.syscall : undefined);
  return NO_DESCRIPTOR.has(code) && syscall === "connect" ? code : undefined;
}
