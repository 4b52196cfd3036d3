import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { HttpControllerClient } from "../../coordinator/client/http-controller-client.js";

// The HTTP controller client's failure mapping against real sockets: only a connection that was
// never made is not_leader (nothing was sent); a connection cut after the request left is
// outcome_unknown (the op may have run).
let server: Server | undefined;
afterEach(async () => {
  server?.closeAllConnections();
  await new Promise((resolve) => (server ? server.close(resolve) : resolve(undefined)));
  server = undefined;
});

const listen = async (handler: Parameters<typeof createServer>[1]) => {
  server = createServer(handler);
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  return `http://127.0.0.1:${(server!.address() as AddressInfo).port}`;
};

describe("HTTP controller client", () => {
  it("nobody listening: not_leader", async () => {
    const url = await listen(() => undefined);
    await new Promise((resolve) => server!.close(resolve)); // the port is free again
    server = undefined;
    await expect(new HttpControllerClient({ baseUrl: url, token: "t" }).call("status", {})).rejects.toMatchObject({ code: "not_leader" });
  });

  it("the coordinator dies after receiving the request: outcome_unknown, not not_leader", async () => {
    let received = 0;
    const url = await listen((req) => {
      received += 1;
      req.socket.destroy(); // crashed mid-commit
    });
    const client = new HttpControllerClient({ baseUrl: url, token: "t" });
    await expect(client.call("commit", { checkpoint_id: "c1", episode_ids: null })).rejects.toMatchObject({ code: "outcome_unknown" });
    expect(received).toBe(1);
  });
});
