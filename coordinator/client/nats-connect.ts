import { subscribe, unsubscribe } from "node:diagnostics_channel";
import type { Socket } from "node:net";
import { connect, type ConnectionOptions, type NatsConnection } from "@nats-io/transport-node";
import { CheckpointError } from "../../protocol/errors.js";
import { natsConnectFailure } from "../../protocol/nats-connect-failure.js";

/** Node publishes every socket `net.connect` creates here. */
const CLIENT_SOCKETS = "net.client.socket";

/**
 * `connect`, with its failures as catalog codes (the CLI, the collector and the daemon connect
 * through it; `consequence` ends the unreachable detail). No server reachable is `not_leader`, as
 * the HTTP client reports a coordinator it cannot reach: nothing was sent, retry once NATS and a
 * coordinator run.
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
export async function connectNats(options: ConnectionOptions & { inboxPrefix: string }, consequence = "no coordinator can be asked; nothing was sent"): Promise<NatsConnection> {
  const sockets: Socket[] = [];
  const opened = (message: unknown) => sockets.push((message as { socket: Socket }).socket);
  subscribe(CLIENT_SOCKETS, opened);
  try {
    return await connect(options);
  } catch (error) {
    for (const socket of sockets) socket.destroy();
    throw natsConnectFailure(error, options.servers, "not_leader", consequence);
  } finally {
    unsubscribe(CLIENT_SOCKETS, opened);
  }
}

/**
 * `connectNats`, tried again every `everyMs` while no server is reachable (`not_leader`), for up to
 * `withinMs`: a long-running job started while its NATS server restarts (a node's processes coming
 * back together) waits for it instead of exiting. Credentials refused or a bad URL fail at once.
 */
export async function connectNatsWithin(
  options: ConnectionOptions & { inboxPrefix: string },
  withinMs: number,
  onWait: (error: CheckpointError) => void = () => undefined,
  everyMs = 250,
): Promise<NatsConnection> {
  const until = Date.now() + withinMs;
  for (let tries = 1; ; tries++) {
    try {
      return await connectNats(options);
    } catch (error) {
      if (!(error instanceof CheckpointError && error.code === "not_leader") || Date.now() + everyMs >= until) throw error;
      if (tries === 1) onWait(error);
      await new Promise((resolve) => setTimeout(resolve, everyMs));
    }
  }
}
