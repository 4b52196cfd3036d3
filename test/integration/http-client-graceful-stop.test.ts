import { afterEach, expect, it } from "vitest";
import { HttpControllerClient } from "../../coordinator/client/http-controller-client.js";
import { CONTROLLER_TOKEN, startWorld, type World } from "./coordinator-harness.js";
import { waitUntil } from "../support/wait-until.js";

/**
 * What an HTTP controller sees while the coordinator stops gracefully (SIGTERM: stop_grace_ms for
 * the ops under way). Its /readyz fails from the stop's start (503, then a refused connection once
 * its listener closes); an op under way is still answered within the grace.
 */
let world: World | undefined;
afterEach(async () => {
  await world?.close();
  world = undefined;
});

it("an op under way when the stop begins gets its answer, not outcome_unknown from the failing /readyz", { timeout: 30_000 }, async () => {
  world = await startWorld();
  await world.startParticipants();
  world.participant("policy").adapter.addEpisode({ rollout_id: "c1", attempt: 0 }, { t: 1 });
  const coordinator = await world.startCoordinator({ stop_grace_ms: 20_000, default_timeout_ms: 20_000 });
  await coordinator.whenReady();
  // Held at prepare by a blocker until the test clears it.
  world.participant("policy").adapter.setBlockers(["c1"]);
  const client = new HttpControllerClient({ baseUrl: coordinator.httpUrl!, token: CONTROLLER_TOKEN, readyCheckMs: 400 });
  let settled: unknown = "pending";
  void client.prepare({ checkpoint_id: "g-1", deadline_ts: Date.now() / 1000 + 20 }).then(
    (reply) => (settled = reply),
    (error: unknown) => (settled = error),
  );
  await waitUntil(() => coordinator.engine.status().then((s) => s.checkpoint?.phase === "preparing"), "g-1 preparing");
  const stopped = coordinator.stop("SIGTERM");
  // Refused for six check periods, three times the two failures that ended the wait before. (Checks
  // 100 ms apart, each its own timeout, made two slow answers of the ready coordinator fail the op on
  // a loaded machine.)
  let refusedSince: number | undefined;
  await waitUntil(async () => {
    const refused = await fetch(`${coordinator.httpUrl!}/readyz`).then(() => false, () => true);
    refusedSince = refused ? (refusedSince ?? performance.now()) : undefined;
    return refusedSince !== undefined && performance.now() - refusedSince >= 2_500;
  }, "the stopping coordinator's /readyz to refuse connections for 2.5 s");
  expect(settled).toBe("pending");
  world.participant("policy").adapter.setBlockers([]);
  await waitUntil(() => settled !== "pending", "the op's answer", 15_000);
  expect(settled).toMatchObject({ checkpoint_id: "g-1" });
  await stopped;
});
