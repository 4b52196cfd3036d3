import { connect, createServer, type Socket } from "node:net";

/**
 * A TCP proxy on 127.0.0.1 in front of nats-server for one process (connect it to `url`): `stall()`
 * holds that process's client→server bytes (a network stall or half partition: it keeps receiving,
 * what it sends is delayed), `heal()` delivers them in order and lets traffic flow again; `cut()`
 * drops its connections and refuses new ones until `heal()` (the process loses NATS).
 */
export interface StallProxy {
  url: string;
  stall(): void;
  cut(): void;
  heal(): void;
  /** Drops every proxied connection and stops listening. */
  close(): Promise<void>;
}

export async function startStallProxy(upstreamPort: number): Promise<StallProxy> {
  let stalled = false;
  let cut = false;
  const pairs = new Set<{ client: Socket; upstream: Socket; held: Buffer[] }>();
  const server = createServer((client) => {
    if (cut) return void client.destroy();
    const upstream = connect(upstreamPort, "127.0.0.1");
    const pair = { client, upstream, held: [] as Buffer[] };
    pairs.add(pair);
    client.on("data", (chunk: Buffer) => {
      if (stalled) pair.held.push(chunk);
      else upstream.write(chunk);
    });
    upstream.on("data", (chunk: Buffer) => client.write(chunk));
    const end = () => {
      pairs.delete(pair);
      client.destroy();
      upstream.destroy();
    };
    for (const socket of [client, upstream]) {
      socket.on("error", end);
      socket.on("close", end);
    }
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address() as { port: number };
  return {
    url: `nats://127.0.0.1:${port}`,
    stall: () => {
      stalled = true;
    },
    cut: () => {
      cut = true;
      for (const pair of pairs) {
        pair.client.destroy();
        pair.upstream.destroy();
      }
    },
    heal: () => {
      stalled = false;
      cut = false;
      for (const pair of pairs) for (const chunk of pair.held.splice(0)) pair.upstream.write(chunk);
    },
    close: async () => {
      for (const pair of pairs) {
        pair.client.destroy();
        pair.upstream.destroy();
      }
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
