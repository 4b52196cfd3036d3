import { connect, type NatsConnection } from "@nats-io/transport-node";
import type { Socket } from "node:net";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import "../../protocol/index.js"; // installs the guard, as every gym-ckpt process does
import { NatsServerProcess } from "../support/nats.js";

/**
 * protocol/nats-write-after-end.ts: nats.js must not write to a socket it has already ended (the
 * server closed the connection). Node would answer with an 'error' event the transport may no
 * longer listen for, an uncaught ERR_STREAM_WRITE_AFTER_END that ends the process (seen in CI while
 * a test stopped nats-server under a waiting request).
 */
let server: NatsServerProcess;
let nc: NatsConnection;

beforeAll(async () => {
  server = await NatsServerProcess.start();
  nc = await connect({ servers: server.url, reconnect: false });
});
afterAll(async () => {
  await nc?.close().catch(() => undefined);
  await server?.stop();
});

describe("nats.js transport: a frame flushed after its socket ended", () => {
  it("is dropped, never written to the ended socket", async () => {
    const transport = (nc as unknown as { protocol: { transport: { socket: Socket; send(frame: Uint8Array): void } } }).protocol.transport;
    const socket = transport.socket;
    const write = vi.spyOn(socket, "write");
    transport.send(new TextEncoder().encode("PING\r\n"));
    expect(write).toHaveBeenCalledTimes(1); // a live socket is written to
    socket.end(); // what the transport's 'end' handler does when the server closes the connection
    transport.send(new TextEncoder().encode("PING\r\n"));
    expect(write).toHaveBeenCalledTimes(1);
  });
});
