import { connect, createServer, type Socket } from "node:net";

/**
 * A TCP proxy on 127.0.0.1 in front of nats-server for one process (connect it to `url`): `stall()`
 * holds that process's client→server bytes (a network stall or half partition: it keeps receiving,
 * what it sends is delayed), `heal()` delivers them in order and lets traffic flow again; `cut()`
 * drops its connections and refuses new ones until `heal()` (the process loses NATS).
 * `dropNextPublish()` loses one message the process publishes, nothing else.
 */
export interface StallProxy {
  url: string;
  stall(): void;
  cut(): void;
  heal(): void;
  /**
   * The next message the process publishes to `subject` (a request: a KV put, say) never reaches
   * nats-server, as if lost on the way; the connection and all else flow on. Settles once dropped.
   */
  dropNextPublish(subject: string): Promise<void>;
  /** Drops every proxied connection and stops listening. */
  close(): Promise<void>;
}

export async function startStallProxy(upstreamPort: number): Promise<StallProxy> {
  let stalled = false;
  let cut = false;
  let drop: { subject: string; dropped: () => void } | undefined;
  const pairs = new Set<{ client: Socket; upstream: Socket; held: Buffer[] }>();
  const server = createServer((client) => {
    if (cut) return void client.destroy();
    const upstream = connect(upstreamPort, "127.0.0.1");
    const pair = { client, upstream, held: [] as Buffer[] };
    pairs.add(pair);
    // Whole protocol ops, not chunks: one message can be dropped without corrupting the stream.
    const ops = new ClientOps();
    client.on("data", (chunk: Buffer) => {
      for (const { op, subject } of ops.push(chunk)) {
        if (drop && subject === drop.subject) {
          const { dropped } = drop;
          drop = undefined;
          dropped();
        } else if (stalled) pair.held.push(op);
        else upstream.write(op);
      }
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
    dropNextPublish: (subject) => new Promise<void>((dropped) => (drop = { subject, dropped })),
    close: async () => {
      for (const pair of pairs) {
        pair.client.destroy();
        pair.upstream.destroy();
      }
      await new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}

/**
 * Splits a client's bytes into NATS protocol ops: a line (`SUB`, `PING`, `CONNECT {…}`), or a
 * `PUB`/`HPUB` line with its payload, whose subject it names. An op cut across chunks waits for its rest.
 */
class ClientOps {
  private pending = Buffer.alloc(0);

  *push(chunk: Buffer): Generator<{ op: Buffer; subject?: string }> {
    this.pending = Buffer.concat([this.pending, chunk]);
    for (;;) {
      const lineEnd = this.pending.indexOf("\r\n");
      if (lineEnd < 0) return;
      const words = this.pending.subarray(0, lineEnd).toString("latin1").trim().split(/\s+/);
      const verb = words[0]!.toUpperCase();
      // PUB <subject> [reply] <size>; HPUB <subject> [reply] <header size> <total size>: the last word.
      const payload = verb === "PUB" || verb === "HPUB" ? Number(words.at(-1)) + 2 : 0;
      const length = lineEnd + 2 + payload;
      if (this.pending.length < length) return;
      const op = this.pending.subarray(0, length);
      this.pending = this.pending.subarray(length);
      yield { op, subject: payload ? words[1] : undefined };
    }
  }
}
