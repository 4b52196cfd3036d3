import { connect, type NatsConnection } from "@nats-io/transport-node";
import { NatsServerProcess } from "../../coordinator/local/nats-server-process.js";

export { NatsServerProcess };

/** A real nats-server plus a connection to it, torn down together. */
export interface NatsFixture {
  server: NatsServerProcess;
  nc: NatsConnection;
  connect(): Promise<NatsConnection>;
  close(): Promise<void>;
}

export async function startNats(): Promise<NatsFixture> {
  const server = await NatsServerProcess.start();
  const connections: NatsConnection[] = [];
  const open = async () => {
    const nc = await connect({ servers: server.url, maxReconnectAttempts: -1, reconnectTimeWait: 100 });
    connections.push(nc);
    return nc;
  };
  const nc = await open();
  return {
    server,
    nc,
    connect: open,
    async close() {
      await Promise.allSettled(connections.map((c) => c.close()));
      await server.dispose();
    },
  };
}
