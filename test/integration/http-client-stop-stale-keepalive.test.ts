import { afterEach, expect, it } from "vitest";
import { HttpControllerClient } from "../../coordinator/client/http-controller-client.js";
import { startStaleKeepAliveRelay, type StaleKeepAliveRelay } from "../support/stale-keepalive-relay.js";
import { waitUntil } from "../support/wait-until.js";
import { CONTROLLER_TOKEN, startWorld, type World } from "./coordinator-harness.js";

/**
 * A coordinator's graceful stop closes the client's idle kept-alive connections; a request written
 * on one as it closes is cut before any reply byte. Nothing ran, but the client cannot tell that cut
 * from a coordinator exiting mid-op, so an op that changes state stays `outcome_unknown`. A read
 * (status, list, get) changes nothing: it is sent again on a new connection, which the stopped
 * coordinator refuses, `not_leader` (sent to the successor). It was `outcome_unknown` before.
 */
let world: World | undefined;
let relay: StaleKeepAliveRelay | undefined;
afterEach(async () => {
  relay?.close();
  relay = undefined;
  await world?.close();
  world = undefined;
});

it.each([
  ["a read (list) is sent again on a new connection: not_leader", "list", "not_leader"],
  ["an op that changes state (renew) stays outcome_unknown", "renew", "outcome_unknown"],
] as const)("a request cut by the stop on a kept-alive connection: %s", { timeout: 30_000 }, async (_what, op, code) => {
  world = await startWorld();
  await world.startParticipants();
  const coordinator = await world.startCoordinator({ stop_grace_ms: 5_000 });
  await coordinator.whenReady();
  relay = await startStaleKeepAliveRelay(Number(new URL(coordinator.httpUrl!).port));
  const client = new HttpControllerClient({ baseUrl: relay.url, token: CONTROLLER_TOKEN });
  // Leaves its connection (and the one of the /readyz asked beside it) kept alive.
  await client.list();
  await coordinator.stop("SIGTERM");
  await waitUntil(() => relay!.stale() === relay!.connections(), "the stop to close every kept-alive connection under the relay");
  relay.stopAccepting();
  const request = op === "list" ? client.list() : client.renew({ checkpoint_id: "k-1", deadline_ts: Date.now() / 1000 + 20 });
  await expect(request).rejects.toMatchObject({ code });
  expect(relay.reset()).toBeGreaterThan(0);
});
