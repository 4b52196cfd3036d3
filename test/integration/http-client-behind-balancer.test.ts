import { afterEach, expect, it } from "vitest";
import { HttpControllerClient } from "../../coordinator/client/http-controller-client.js";
import { HEADER_COORDINATOR_EPOCH, HEADER_COORDINATOR_ID } from "../../protocol/index.js";
import { startHttpGateway, type HttpGateway } from "../support/http-gateway.js";
import { waitUntil } from "../support/wait-until.js";
import { CONTROLLER_TOKEN, startWorld, type World } from "./coordinator-harness.js";

/**
 * An HTTP controller behind a round-robin load balancer in front of a leader and its standbys: the
 * client's /readyz checks beside a long op reach the standbys too, whose `not_leader` says nothing
 * about the op under way at the leader. The client counted two such refusals in a row as the op's
 * coordinator having stopped leading and ended the op outcome_unknown while the leader still ran it.
 */
let world: World | undefined;
let gateway: HttpGateway | undefined;
afterEach(async () => {
  await gateway?.close();
  gateway = undefined;
  await world?.close();
  world = undefined;
});

it("a standby's /readyz refusal through the balancer does not end an op under way at the leader", { timeout: 30_000 }, async () => {
  world = await startWorld();
  await world.startParticipants();
  world.participant("policy").adapter.addEpisode({ rollout_id: "c1", attempt: 0 }, { t: 1 });
  const leader = await world.startCoordinator({ coordinator_id: "coord-a", default_timeout_ms: 20_000 });
  await leader.whenReady();
  const standbys = [await world.startCoordinator({ coordinator_id: "coord-b" }), await world.startCoordinator({ coordinator_id: "coord-c" })];
  // Each /readyz names the coordinator that answers it, ready or not, in headers; the bodies are as
  // before (an older client reads them strictly).
  const answer = async (url: string) => {
    const response = await fetch(`${url}/readyz`);
    return [response.status, response.headers.get(HEADER_COORDINATOR_ID), response.headers.get(HEADER_COORDINATOR_EPOCH), await response.json()];
  };
  expect(await answer(leader.httpUrl!)).toEqual([200, "coord-a", expect.stringMatching(/^[0-9]+$/), { ok: true, epoch: expect.any(Number) }]);
  expect(await answer(standbys[0]!.httpUrl!)).toEqual([503, "coord-b", null, { error: { code: "not_leader", detail: expect.any(String) } }]);
  gateway = await startHttpGateway([leader.httpUrl!, ...standbys.map((s) => s.httpUrl!)]);
  // Held at prepare by a blocker until the test clears it.
  world.participant("policy").adapter.setBlockers(["c1"]);
  // leaderWaitMs: an op the balancer hands a standby is refused not_leader, and sent again.
  const client = new HttpControllerClient({ baseUrl: gateway.url, token: CONTROLLER_TOKEN, readyCheckMs: 300, leaderWaitMs: 10_000 });
  let settled: unknown = "pending";
  void client.prepare({ checkpoint_id: "lb-1", deadline_ts: Date.now() / 1000 + 20 }).then(
    (reply) => (settled = reply),
    (error: unknown) => (settled = error),
  );
  await waitUntil(() => leader.engine.status().then((s) => s.checkpoint?.phase === "preparing"), "lb-1 preparing at the leader");
  // Round robin over three: two of every three checks reach a standby, two in a row each cycle.
  const standbyRefusals = () => gateway!.answered.filter(({ path, status, upstream }) => path === "/readyz" && status === 503 && upstream !== leader.httpUrl).length;
  const before = standbyRefusals();
  await waitUntil(() => standbyRefusals() >= before + 6 || settled !== "pending", "six standby refusals of the client's /readyz", 15_000);
  expect(settled).toBe("pending");
  world.participant("policy").adapter.setBlockers([]);
  await waitUntil(() => settled !== "pending", "the op's answer", 15_000);
  expect(settled).toMatchObject({ checkpoint_id: "lb-1", prepared: true });
});
