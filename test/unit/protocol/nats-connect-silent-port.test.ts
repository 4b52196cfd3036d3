import { createServer, type Socket } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { connectNats } from "../../../protocol/nats-first-connect.js";
import { waitUntil } from "../../support/wait-until.js";

/**
 * A port that accepts TCP but never sends NATS' INFO (the coordinator's HTTP port given as
 * --nats-url, a stalled server): the connect times out, and the socket nats.js opened must not stay
 * open, or it keeps the CLI, the collector or the daemon alive for ever after the refusal.
 */
const accepted: Socket[] = [];
const server = createServer((socket) => {
  accepted.push(socket);
  socket.on("error", () => undefined);
});
afterEach(async () => {
  for (const socket of accepted) socket.destroy();
  await new Promise((resolve) => server.close(resolve));
});

describe("connectNats against a silent port", () => {
  it("refuses as not_leader and closes the connection it opened", async () => {
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const url = `nats://127.0.0.1:${(server.address() as { port: number }).port}`;
    await expect(connectNats({ servers: url, timeout: 300, inboxPrefix: "_INBOX" }, { unreachable: "not_leader", consequence: "nothing was sent" })).rejects.toMatchObject({ code: "not_leader", message: expect.stringContaining("(timeout)") });
    expect(accepted.length).toBeGreaterThan(0);
    const closed = accepted.map((socket) => new Promise<void>((resolve) => (socket.readableEnded || socket.destroyed ? resolve() : socket.once("close", () => resolve()))));
    let done = 0;
    for (const c of closed) void c.then(() => (done += 1));
    await waitUntil(() => done === closed.length, "the client to close its half-open NATS connection", 5_000);
  });
});
