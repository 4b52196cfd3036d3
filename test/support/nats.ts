import { connect, type NatsConnection } from "@nats-io/transport-node";
import { NatsServerProcess, type NatsServerExit, type NatsServerOptions } from "../../coordinator/local/nats-server-process.js";

export { NatsServerProcess };

/** A real nats-server plus a connection to it, torn down together. */
export interface NatsFixture {
  server: NatsServerProcess;
  nc: NatsConnection;
  connect(): Promise<NatsConnection>;
  close(): Promise<void>;
}

/**
 * A server that goes away on its own, or a connection that drops while its server still runs, is
 * written to stderr with the server's log: a test failing for it says why (slow consumer, crash, kill).
 */
const report = (what: string, detail: string) => process.stderr.write(`[nats fixture] ${what}\n${detail}\n`);
const reportExit = (exit: NatsServerExit) => report(`nats-server pid ${exit.pid} on port ${exit.port} exited unasked (code ${exit.code}, signal ${exit.signal})`, exit.log);

export async function startNats(options: Pick<NatsServerOptions, "exitWithParent"> = {}): Promise<NatsFixture> {
  const server = await NatsServerProcess.start({ ...options, onUnexpectedExit: reportExit });
  const connections: NatsConnection[] = [];
  let closing = false;
  const open = async () => {
    const nc = await connect({ servers: server.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    connections.push(nc);
    // The launch it is connected to: a server restarted since dropped it on purpose.
    let launch = server.launches;
    void (async () => {
      for await (const status of nc.status()) {
        if (status.type === "reconnect") launch = server.launches;
        if (status.type === "disconnect" && !closing && server.running && launch === server.launches) {
          report(`a test connection to ${server.url} dropped while its nats-server (pid ${server.pid}) runs`, server.log);
        }
      }
    })();
    return nc;
  };
  const nc = await open();
  return {
    server,
    nc,
    connect: open,
    async close() {
      closing = true;
      await Promise.allSettled(connections.map((c) => c.close()));
      await server.dispose();
    },
  };
}
