import { errors, type ConnectionOptions } from "@nats-io/transport-node";
import { CheckpointError, type ErrorCode } from "./errors.js";
import { redactNatsServers } from "./nats-connection.js";

/** Socket errors of a first connect: no NATS server could be reached at that address. */
const UNREACHABLE = new Set(["ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "ETIMEDOUT", "ECONNRESET"]);

/**
 * A first `connect` that failed, as a catalog code, the servers' credentials redacted. No server
 * reachable is `unreachable` (what a participant reports; the CLI and the coordinator say
 * `not_leader`, as the HTTP client says of a coordinator it cannot reach), `consequence` ending
 * the detail. Credentials NATS refuses are `unauthorized`; servers nats.js cannot parse are
 * `invalid_request`: configuration, which a restart cannot fix.
 */
export function natsConnectFailure(
  error: unknown,
  servers: ConnectionOptions["servers"],
  unreachable: Extract<ErrorCode, "unreachable" | "not_leader">,
  consequence: string,
): CheckpointError {
  const where = `NATS at ${redactNatsServers([servers ?? []].flat().join(",")) || "the default server"}`;
  const message = error instanceof Error ? error.message : String(error);
  const code = (error as { code?: unknown } | undefined)?.code;
  if (error instanceof errors.ConnectionError || error instanceof errors.TimeoutError || (typeof code === "string" && UNREACHABLE.has(code))) {
    return new CheckpointError(unreachable, `cannot reach ${where} (${message}): ${consequence}`, { cause: error });
  }
  if (error instanceof errors.AuthorizationError || error instanceof errors.UserAuthenticationExpiredError) {
    return new CheckpointError("unauthorized", `${where} refused the connection's credentials (${message}); set GYM_CKPT_NATS_USER and GYM_CKPT_NATS_PASS, or GYM_CKPT_NATS_TOKEN`, { cause: error });
  }
  if (error instanceof errors.InvalidArgumentError || code === "ERR_INVALID_URL") {
    return new CheckpointError("invalid_request", `cannot connect to ${where}: ${message}`, { cause: error });
  }
  return error instanceof CheckpointError ? error : new CheckpointError("internal_error", `cannot connect to ${where}: ${message}`, { cause: error });
}
