import { connect, createServer, type AddressInfo, type Socket } from "node:net";

/**
 * A TCP relay on 127.0.0.1 in front of one HTTP server that holds back the server's close of a
 * kept-alive connection from the client, so the client writes its next request on a connection the
 * server already closed: the race of a request sent as the server closes an idle connection, made
 * certain. That request is answered with a reset, as a closed socket's host answers it, and never
 * reaches the server. `stopAccepting()` refuses new connections, as the server's closed listener does.
 * `holdsClose` picks the connections whose close is held back, by the start of their first request
 * (the others are closed as the server closes them).
 */
export interface StaleKeepAliveRelay {
  url: string;
  /** How many client connections the relay accepted. */
  connections(): number;
  /** How many of them the server closed under the relay, held back from the client (stale now). */
  stale(): number;
  /** Requests the relay answered with a reset. */
  reset(): number;
  stopAccepting(): void;
  close(): void;
}

export async function startStaleKeepAliveRelay(upstreamPort: number, holdsClose: (firstRequest: string) => boolean = () => true): Promise<StaleKeepAliveRelay> {
  const sockets = new Set<Socket>();
  let connections = 0;
  let stale = 0;
  let reset = 0;
  const server = createServer((client) => {
    connections += 1;
    const upstream = connect(upstreamPort, "127.0.0.1");
    sockets.add(client).add(upstream);
    let closed = false;
    let held: boolean | undefined;
    client.on("data", (chunk: Buffer) => {
      held ??= holdsClose(chunk.toString("latin1"));
      if (!closed) return void upstream.write(chunk);
      reset += 1;
      client.resetAndDestroy();
    });
    upstream.on("data", (chunk: Buffer) => client.write(chunk));
    upstream.on("close", () => {
      if (held === false) return void client.destroy();
      if (!closed) stale += 1;
      closed = true;
    });
    upstream.on("error", () => undefined);
    client.on("error", () => undefined).on("close", () => upstream.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    connections: () => connections,
    stale: () => stale,
    reset: () => reset,
    stopAccepting: () => void server.close(),
    close: () => {
      server.close();
      for (const socket of sockets) socket.destroy();
    },
  };
}
