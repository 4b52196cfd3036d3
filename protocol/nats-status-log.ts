import type { Status } from "@nats-io/transport-node";
import type { SpellLogger } from "./failure-spell-log.js";

/**
 * Logs a process's NATS connection (the coordinator's, a participant's) dropping and coming back: one `nats_disconnected` warning
 * (`server`) when it drops, its reconnect attempts at debug (`nats_reconnecting`, one each 500 ms
 * for as long as the outage lasts), and one `nats_reconnected` (`server`, `down_s`,
 * `reconnect_attempts`) when it is back. Before, a process that lost NATS said nothing until
 * the connection closed for good: the lease, the controller API or the phase messages failing
 * meanwhile had no cause in the log. Resolves when the status iterator ends (the connection closed) or at the first
 * status after `stopped()`.
 */
export async function logNatsStatus(statuses: AsyncIterable<Status>, log: SpellLogger, stopped: () => boolean = () => false, now: () => number = () => performance.now()): Promise<void> {
  let downSince: number | undefined;
  let attempts = 0;
  for await (const status of statuses) {
    // A connection the caller gave (not closed at stop) goes on after this process stopped.
    if (stopped()) return;
    switch (status.type) {
      case "disconnect":
        if (downSince !== undefined) {
          log.debug({ server: status.server }, "nats_disconnected");
          break;
        }
        downSince = now();
        attempts = 0;
        log.warn({ server: status.server, reconnect_attempts_logged_at: "debug" }, "nats_disconnected");
        break;
      case "reconnecting":
        attempts++;
        log.debug({ reconnect_attempts: attempts }, "nats_reconnecting");
        break;
      case "reconnect":
        log.info({ server: status.server, ...(downSince !== undefined && { down_s: Math.round((now() - downSince) / 100) / 10 }), reconnect_attempts: attempts }, "nats_reconnected");
        downSince = undefined;
        attempts = 0;
        break;
      case "ldm":
        // The server is shutting down (lame duck mode): a disconnect follows.
        log.info({ server: status.server }, "nats_server_lame_duck");
        break;
      default:
        break;
    }
  }
}
