import { connect, errors, type ConnectionOptions, type NatsConnection } from "@nats-io/transport-node";
import { CheckpointError, redactNatsServers } from "../../protocol/index.js";

/** Socket errors of a first connect: no NATS server could be reached at that address. */
const UNREACHABLE = new Set(["ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "ETIMEDOUT", "ECONNRESET"]);

/**
 * `connect`, with its failures as catalog codes (the CLI, the collector and the daemon connect
 * through it; `consequence` ends the unreachable detail). No server reachable is `not_leader`, as the HTTP client reports a coordinator it
 * cannot reach: nothing was sent, retry once NATS and a coordinator run. Credentials NATS refuses
 * are `unauthorized`; servers nats.js cannot parse are `invalid_request`.
 */
export async function connectNats(options: ConnectionOptions, consequence = "no coordinator can be asked; nothing was sent"): Promise<NatsConnection> {
  try {
    return await connect(options);
  } catch (error) {
    throw connectFailure(error, options.servers, consequence);
  }
}

function connectFailure(error: unknown, servers: ConnectionOptions["servers"], consequence: string): CheckpointError {
  const where = `NATS at ${redactNatsServers([servers ?? []].flat().join(",")) || "the default server"}`;
  const message = error instanceof Error ? error.message : String(error);
  const code = (error as { code?: unknown }).code;
  if (error instanceof errors.ConnectionError || error instanceof errors.TimeoutError || (typeof code === "string" && UNREACHABLE.has(code))) {
    return new CheckpointError("not_leader", `cannot reach ${where} (${message}): ${consequence}`, { cause: error });
  }
  if (error instanceof errors.AuthorizationError || error instanceof errors.UserAuthenticationExpiredError) {
    return new CheckpointError("unauthorized", `${where} refused the connection's credentials (${message}); set GYM_CKPT_NATS_USER and GYM_CKPT_NATS_PASS, or GYM_CKPT_NATS_TOKEN`, { cause: error });
  }
  if (error instanceof errors.InvalidArgumentError || code === "ERR_INVALID_URL") {
    return new CheckpointError("invalid_request", `cannot connect to ${where}: ${message}`, { cause: error });
  }
  return error instanceof CheckpointError ? error : new CheckpointError("internal_error", `cannot connect to ${where}: ${message}`, { cause: error });
}
