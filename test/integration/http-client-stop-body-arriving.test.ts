import { connect, createServer, type AddressInfo, type Server, type Socket } from "node:net";
import { afterEach, expect, it } from "vitest";
import { HttpControllerClient } from "../../coordinator/client/http-controller-client.js";
import { waitUntil } from "../support/wait-until.js";
import { CONTROLLER_TOKEN, startWorld, type World } from "./coordinator-harness.js";

/**
 * A coordinator's graceful stop begins while an op's body is still arriving (a slow link): nothing
 * ran, and the client is told so (`not_leader`, sent again to the successor). The stop closed that
 * connection unanswered before, which the client could only read as `outcome_unknown`. A TCP relay
 * between the real client and the real coordinator passes a POST's head and the first bytes of its
 * body, and holds the rest.
 */
let world: World | undefined;
let relay: Server | undefined;
const sockets = new Set<Socket>();
afterEach(async () => {
  for (const socket of sockets) socket.destroy();
  sockets.clear();
  await new Promise((resolve) => (relay ? relay.close(resolve) : resolve(undefined)));
  relay = undefined;
  await world?.close();
  world = undefined;
});

/** Relays to `port`; a connection whose request is a POST gets its head and `bodyBytes` of its body through, no more. */
async function startHoldingRelay(port: number, bodyBytes: number): Promise<{ url: string; held: Promise<void> }> {
  let onHeld!: () => void;
  const held = new Promise<void>((resolve) => (onHeld = resolve));
  relay = createServer((client) => {
    const upstream = connect(port, "127.0.0.1");
    sockets.add(client).add(upstream);
    let seen = Buffer.alloc(0);
    let holding = false;
    client.on("data", (chunk: Buffer) => {
      if (holding) return;
      seen = Buffer.concat([seen, chunk]);
      const headEnd = seen.indexOf("\r\n\r\n");
      if (!seen.subarray(0, 4).equals(Buffer.from("POST")) || headEnd < 0) return void upstream.write(chunk);
      holding = true;
      const passed = seen.length - chunk.length;
      upstream.write(chunk.subarray(0, headEnd + 4 + bodyBytes - passed), () => onHeld());
    });
    upstream.on("data", (chunk: Buffer) => client.write(chunk));
    const end = () => {
      client.destroy();
      upstream.destroy();
    };
    for (const socket of [client, upstream]) socket.on("close", end).on("error", end);
  });
  await new Promise<void>((resolve) => relay!.listen(0, "127.0.0.1", resolve));
  return { url: `http://127.0.0.1:${(relay.address() as AddressInfo).port}`, held };
}

it("an op whose body is still arriving when the stop begins is refused not_leader, and runs nothing", { timeout: 30_000 }, async () => {
  world = await startWorld();
  await world.startParticipants();
  const coordinator = await world.startCoordinator({ stop_grace_ms: 5_000 });
  await coordinator.whenReady();
  const { url, held } = await startHoldingRelay(Number(new URL(coordinator.httpUrl!).port), 5);
  const client = new HttpControllerClient({ baseUrl: url, token: CONTROLLER_TOKEN });
  let settled: unknown = "pending";
  void client.prepare({ checkpoint_id: "b-1", deadline_ts: Date.now() / 1000 + 20 }).then(
    (reply) => (settled = reply),
    (error: unknown) => (settled = error),
  );
  await held;
  // The held request's bytes reached the coordinator's socket before this connection was made: one
  // answer later, its server read them (unread, the connection would be idle to the stop).
  expect((await fetch(`${coordinator.httpUrl!}/healthz`)).status).toBe(200);
  expect(settled).toBe("pending");
  await coordinator.stop("SIGTERM");
  await waitUntil(() => settled !== "pending", "the op's answer", 10_000);
  expect(settled).toMatchObject({ code: "not_leader" });
  expect((await coordinator.engine.status()).checkpoint).toBeNull();
});
