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

/**
 * An op under way when the stop begins is answered, and its connection closed after: the answer says
 * so (`Connection: close`). A client keeping the connection alive wrote its next op on it as it
 * closed, `outcome_unknown` (the relay holds back that close, the race made certain); now it opens a
 * new one, which the stopped coordinator refuses: `not_leader`, nothing ran.
 */
it("the next op after an answer sent during the stop goes on a new connection: not_leader, not outcome_unknown", { timeout: 30_000 }, async () => {
  world = await startWorld();
  await world.startParticipants();
  world.participant("policy").adapter.addEpisode({ rollout_id: "c1", attempt: 0 }, { t: 1 });
  const coordinator = await world.startCoordinator({ stop_grace_ms: 20_000, default_timeout_ms: 20_000 });
  await coordinator.whenReady();
  // Only the op's connection: an idle /readyz one the stop closes is the race no answer can prevent.
  relay = await startStaleKeepAliveRelay(Number(new URL(coordinator.httpUrl!).port), (first) => first.startsWith("POST"));
  world.participant("policy").adapter.setBlockers(["c1"]);
  const client = new HttpControllerClient({ baseUrl: relay.url, token: CONTROLLER_TOKEN });
  const prepared = client.prepare({ checkpoint_id: "k-2", deadline_ts: Date.now() / 1000 + 20 });
  await waitUntil(() => coordinator.engine.status().then((s) => s.checkpoint?.phase === "preparing"), "k-2 preparing");
  const stopped = coordinator.stop("SIGTERM");
  // Answered once the HTTP API is stopping (its listener closed): answered before, it was an idle
  // connection to the stop, closed with no answer to say so.
  await waitUntil(() => fetch(coordinator.httpUrl!).then(() => false, () => true), "the coordinator's listener to close");
  world.participant("policy").adapter.setBlockers([]);
  await expect(prepared).resolves.toMatchObject({ checkpoint_id: "k-2" });
  await stopped;
  await waitUntil(() => relay!.stale() === 1, "the stop to close the op's connection under the relay");
  relay.stopAccepting();
  await expect(client.resume({ checkpoint_id: "k-2", deadline_ts: Date.now() / 1000 + 20 })).rejects.toMatchObject({ code: "not_leader" });
  expect(relay.reset()).toBe(0);
});
