import { afterEach, expect, it } from "vitest";
import { HttpControllerClient } from "../../coordinator/client/http-controller-client.js";
import { startHttpGateway, type HttpGateway } from "../support/http-gateway.js";
import { waitUntil } from "../support/wait-until.js";
import { CONTROLLER_TOKEN, startWorld, type World } from "./coordinator-harness.js";

/**
 * The graceful stop of http-client-graceful-stop.test.ts behind a reverse proxy: once the coordinator
 * closed its listener, its /readyz is the proxy's 502 (it cannot connect), not a refused connection.
 * That is the same stop in progress: the op under way is still answered. The client counted each
 * 502 as a failed check and ended the op outcome_unknown after two.
 */
let world: World | undefined;
let gateway: HttpGateway | undefined;
afterEach(async () => {
  await gateway?.close();
  gateway = undefined;
  await world?.close();
  world = undefined;
});

it("an op under way when the stop begins gets its answer through a proxy answering /readyz 502", { timeout: 30_000 }, async () => {
  world = await startWorld();
  await world.startParticipants();
  world.participant("policy").adapter.addEpisode({ rollout_id: "c1", attempt: 0 }, { t: 1 });
  const coordinator = await world.startCoordinator({ stop_grace_ms: 20_000, default_timeout_ms: 20_000 });
  await coordinator.whenReady();
  gateway = await startHttpGateway(coordinator.httpUrl!);
  // Held at prepare by a blocker until the test clears it.
  world.participant("policy").adapter.setBlockers(["c1"]);
  const client = new HttpControllerClient({ baseUrl: gateway.url, token: CONTROLLER_TOKEN, readyCheckMs: 400 });
  let settled: unknown = "pending";
  void client.prepare({ checkpoint_id: "g-1", deadline_ts: Date.now() / 1000 + 20 }).then(
    (reply) => (settled = reply),
    (error: unknown) => (settled = error),
  );
  await waitUntil(() => coordinator.engine.status().then((s) => s.checkpoint?.phase === "preparing"), "g-1 preparing");
  const stopped = coordinator.stop("SIGTERM");
  // Six of the client's checks answered 502 by the proxy: three times the two failures that ended the wait.
  const gatewayErrors = () => gateway!.answered.filter(({ path, status }) => path === "/readyz" && status === 502).length;
  await waitUntil(() => gatewayErrors() >= 6 || settled !== "pending", "the proxy to answer the client's /readyz 502 six times", 15_000);
  expect(settled).toBe("pending");
  world.participant("policy").adapter.setBlockers([]);
  await waitUntil(() => settled !== "pending", "the op's answer", 15_000);
  expect(settled).toMatchObject({ checkpoint_id: "g-1" });
  await stopped;
});
