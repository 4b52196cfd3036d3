import { subscribe, unsubscribe } from "node:diagnostics_channel";
import type { Socket } from "node:net";
import { connect, errors, type ConnectionOptions, type NatsConnection } from "@nats-io/transport-node";
import { CheckpointError, type ErrorCode } from "./errors.js";
import { redactNatsServers } from "./nats-connection.js";

/**
 * A process's first connection to NATS, for every gym-ckpt process: the CLI, the collector, the
 * coordinator daemon and the participant programs. Its failures become catalog codes; a process
 * started while its NATS server restarts (a node's processes coming back together) can wait for it.
 */

/** How a failed first connect is reported: the code for "no server reachable" and what that means for the caller. */
export interface FirstConnectFailure {
  /** `unreachable` for a participant; the CLI, the collector and the coordinator say `not_leader` (nothing was sent). */
  unreachable: Extract<ErrorCode, "unreachable" | "not_leader">;
  /** Ends the detail: what the caller could not do. */
  consequence: string;
}

/**
 * How long a long-running process (coordinator daemon, participant program) waits at start for a
 * NATS server that does not accept connections yet: a NATS restart takes seconds, and a process
 * restarted in the middle of one (a node's processes coming back together) should not exit for it.
 * The coordinator's `nats.connect_wait_ms`, a participant's `--nats-connect-wait-ms`, both
 * GYM_CKPT_NATS_CONNECT_WAIT_MS.
 */
export const DEFAULT_NATS_CONNECT_WAIT_MS = 10_000;
export const MAX_NATS_CONNECT_WAIT_MS = 600_000;

/** Node publishes every socket `net.connect` creates here. */
const CLIENT_SOCKETS = "net.client.socket";

/** Socket errors of a first connect: no NATS server could be reached at that address. */
const UNREACHABLE = new Set(["ECONNREFUSED", "ENOTFOUND", "EHOSTUNREACH", "ENETUNREACH", "EAI_AGAIN", "ETIMEDOUT", "ECONNRESET"]);

/**
 * A first `connect` that failed, as a catalog code, the servers' credentials redacted. No server
 * reachable is `failure.unreachable` (as the HTTP client says `not_leader` of a coordinator it
 * cannot reach), `failure.consequence` ending the detail. Credentials NATS refuses are
 * `unauthorized`; servers nats.js cannot parse are `invalid_request`: configuration, which a
 * restart cannot fix.
 */
function natsConnectFailure(error: unknown, servers: ConnectionOptions["servers"], { unreachable, consequence }: FirstConnectFailure): CheckpointError {
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

/**
 * `connect`, with its failures as catalog codes (`natsConnectFailure`).
 *
 * A first connect that times out after its TCP connection was made (a port that accepts but never
 * sends NATS' INFO: the coordinator's HTTP port, a stalled server, a proxy) leaves nats.js's socket
 * open (its transport closes only connections it finished), which kept the process alive for ever
 * after its refusal was printed: a CLI command never returned, a daemon was never restarted. The
 * sockets opened while connecting are destroyed when the connect fails.
 *
 * `inboxPrefix` is required: the caller's role's (`NATS_INBOX_PREFIXES`), the only reply subjects
 * its NATS user may subscribe to under the production permissions.
 */
export async function connectNats(options: ConnectionOptions & { inboxPrefix: string }, failure: FirstConnectFailure): Promise<NatsConnection> {
  const sockets: Socket[] = [];
  const opened = (message: unknown) => sockets.push((message as { socket: Socket }).socket);
  subscribe(CLIENT_SOCKETS, opened);
  try {
    return await connect(options);
  } catch (error) {
    for (const socket of sockets) socket.destroy();
    throw natsConnectFailure(error, options.servers, failure);
  } finally {
    unsubscribe(CLIENT_SOCKETS, opened);
  }
}

/**
 * `connectNats`, tried again every `everyMs` while no server is reachable, for up to `withinMs`
 * (0: once): a long-running process started while its NATS server restarts waits for it instead of
 * exiting, saying so once to `log` (a pino logger fits). Credentials refused or a bad URL fail at once.
 */
export async function connectNatsWithin(
  options: ConnectionOptions & { inboxPrefix: string },
  withinMs: number,
  failure: FirstConnectFailure,
  log?: { warn(fields: object, message: string): void },
  everyMs = 250,
): Promise<NatsConnection> {
  // A duration within this process: a wall-clock step must neither end the wait nor stretch it.
  const until = performance.now() + withinMs;
  for (let tries = 1; ; tries++) {
    try {
      return await connectNats(options, failure);
    } catch (error) {
      if (!(error instanceof CheckpointError && error.code === failure.unreachable) || performance.now() + everyMs >= until) throw error;
      if (tries === 1) log?.warn({ err: error, wait_ms: withinMs }, "NATS is not reachable yet; trying again");
      await new Promise((resolve) => setTimeout(resolve, everyMs));
    }
  }
}
