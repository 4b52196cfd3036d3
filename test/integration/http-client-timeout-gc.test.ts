import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { setFlagsFromString } from "node:v8";
import { runInNewContext } from "node:vm";
import { afterEach, expect, it } from "vitest";
import { HttpControllerClient } from "../../coordinator/client/http-controller-client.js";

/**
 * An op's reply timeout must fire however the garbage collector runs. It was an
 * `AbortSignal.timeout()` inside `AbortSignal.any()`, which Node 20 holds only weakly
 * (nodejs/node#57736): a full GC while the op waited collected it, and an op whose coordinator never
 * answered (and whose /readyz said nothing against it) waited for ever. Seen in CI as a 60 s test
 * timeout under load; a GC forced every 20 ms makes it certain.
 */
setFlagsFromString("--expose-gc");
const gc = runInNewContext("gc") as () => void;

let server: Server | undefined;
afterEach(async () => {
  server?.closeAllConnections();
  await new Promise((resolve) => server?.close(resolve) ?? resolve(undefined));
  server = undefined;
});

it("an op the coordinator never answers ends outcome_unknown at its deadline plus slack while the GC runs", async () => {
  server = createServer((req, res) => {
    // /readyz: ready all along (nothing ends the op but its timeout); the op: never answered.
    if (req.url === "/readyz") res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify({ ok: true, epoch: 1 }));
  });
  await new Promise<void>((resolve) => server!.listen(0, "127.0.0.1", resolve));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const client = new HttpControllerClient({ baseUrl: url, token: "t", readyCheckMs: 100, slackMs: 200 });
  const collecting = setInterval(gc, 20);
  try {
    const started = performance.now();
    const outcome = await Promise.race([
      client.commit({ checkpoint_id: "gc1", episode_ids: [], deadline_ts: Date.now() / 1000 + 0.5 }).catch((error: unknown) => error),
      new Promise((resolve) => setTimeout(() => resolve("still waiting after 5 s"), 5_000)),
    ]);
    expect(outcome).toMatchObject({ code: "outcome_unknown", message: expect.stringContaining("no reply from /v1/commit") });
    expect(performance.now() - started).toBeLessThan(5_000);
  } finally {
    clearInterval(collecting);
  }
});
