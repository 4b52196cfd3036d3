import { connect, type ConnectionOptions, type NatsConnection } from "@nats-io/transport-node";
import { natsConnectFailure } from "../../protocol/nats-connect-failure.js";

/**
 * `connect`, with its failures as catalog codes (the CLI, the collector and the daemon connect
 * through it; `consequence` ends the unreachable detail). No server reachable is `not_leader`, as
 * the HTTP client reports a coordinator it cannot reach: nothing was sent, retry once NATS and a
 * coordinator run.
 */
export async function connectNats(options: ConnectionOptions, consequence = "no coordinator can be asked; nothing was sent"): Promise<NatsConnection> {
  try {
    return await connect(options);
  } catch (error) {
    throw natsConnectFailure(error, options.servers, "not_leader", consequence);
  }
}
