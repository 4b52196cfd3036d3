import { CheckpointError } from "./errors.js";

/**
 * The errnos of a listen() that say the address chosen cannot be had here (not that gym-ckpt
 * broke), and how the line says it. EACCES/EPERM: below net.ipv4.ip_unprivileged_port_start
 * (1024 unless lowered) without CAP_NET_BIND_SERVICE. ENOTFOUND: a host name (`--http-host`) no resolver knows.
 */
const REASONS: Readonly<Record<string, string>> = {
  EADDRINUSE: "address already in use",
  EACCES: "permission denied: a low port needs privileges",
  EPERM: "not permitted: a low port needs privileges",
  EADDRNOTAVAIL: "no such address on this host",
  // A host name that does not resolve (NXDOMAIN). Not EAI_AGAIN: a resolver down may be back at the restart.
  ENOTFOUND: "no such host name",
};

const refusals = new WeakSet<CheckpointError>();

/**
 * A listen() on `host`:`port` that failed because of the address `setting` (a flag or variable)
 * chose, as `invalid_request` naming the setting, the address and the errno: the user's
 * configuration, exit 2, rather than `internal_error` (exit 1, restarted for ever on a port that
 * stays taken). Any other failure is returned as it is.
 */
export function listenRefusal(error: unknown, setting: string, host: string, port: number): unknown {
  const errno = (error as NodeJS.ErrnoException | undefined)?.code;
  const reason = errno === undefined ? undefined : REASONS[errno];
  if (reason === undefined) return error;
  const address = host.includes(":") ? `[${host}]:${port}` : `${host}:${port}`;
  const refusal = new CheckpointError("invalid_request", `${setting} ${port}: cannot listen on ${address} (${errno}: ${reason})`, { cause: error });
  refusals.add(refusal);
  return refusal;
}

/** Whether `error` came from listenRefusal (a program may print it otherwise than other configuration errors). */
export function isListenRefusal(error: unknown): error is CheckpointError {
  return error instanceof CheckpointError && refusals.has(error);
}
