import { afterAll, beforeAll, beforeEach, describe, expect, it } from "vitest";
import { startGymWorld, type BackendCall, type GymWorld } from "../support/gym-processes.js";
import { ep } from "../support/episode.js";

/**
 * The policy-model participant end to end (nats-server, coordinator, policy backend, attach proxy,
 * resources, agent, environment as real processes): an in-flight generation is cut and continued
 * by the replacement; the undelivered call is re-issued exactly once; restoring the same checkpoint
 * twice keeps the lineage rooted at the source's delivered call.
 */
let world: GymWorld;

beforeAll(async () => {
  world = await startGymWorld();
}, 60_000);
afterAll(async () => {
  await world?.close();
});
beforeEach(async () => {
  await world.backend.reset();
});

type FullCall = BackendCall & { parent_call_id: string | null; cut_ids: string[] };
const callsOf = async (rollout: string) =>
  ((await world.backend.calls()) as FullCall[]).filter((c) => c.capture_key === rollout || c.capture_key?.startsWith(`${rollout}-a`));
const cutsAt = async (): Promise<{ checkpoint_id: string; model_call_ids: string[]; dispositions: string[] }[]> =>
  ((await (await fetch(`${world.gym.urls.policy!.replace(/\/+$/, "")}/admin/cuts`)).json()) as any).cuts;
const ledgerOf = async (key: string): Promise<any[]> => {
  const response = await fetch(`${world.gym.urls.model!.replace(/\/+$/, "")}/ng-capture/v1/ledger/${key}`, { headers: { authorization: "Bearer gym-e2e-token" } });
  return ((await response.json()) as any).records;
};

/** Starts an episode and waits until the backend holds its call number `held`. */
async function startUntilHeld(rollout: string, held: number, attempt = 0, task: object = { expression: "17 + 25", tool_rounds: 1 }) {
  await world.backend.hold(held - 1);
  const run = world.run(rollout, attempt, task).catch((error: unknown) => ({ status: 0, body: { lost: String(error) } }));
  await world.waitFor(async () => (await callsOf(rollout)).length >= held, `call ${held} of ${rollout} at the backend`);
  return { run };
}

describe("policy model: generation cuts and the capture ledger", () => {
  it("cuts the in-flight generation; the replacement continues from it and re-issues the undelivered call exactly once", async () => {
    const { run: lost } = await startUntilHeld("cut-1", 2);
    await world.checkpointNoResume("cp-cut-1", [ep("cut-1")]);
    const [first, inflight] = await callsOf("cut-1");
    // Exactly one cut round, naming the in-flight call.
    expect(await cutsAt()).toEqual([{ checkpoint_id: "cp-cut-1", model_call_ids: [inflight!.model_call_id], dispositions: ["durable_prefix"], cut_id: expect.any(String) }]);
    await world.crashAndRestart("cp-cut-1");
    await world.backend.release();
    expect((await lost).status).not.toBe(200);
    await world.restoreAndResume("cp-cut-1", [ep("cut-1")]);
    expect((await world.status("model")).extras).toMatchObject({ restored_generation_cuts: 1 });
    const replacement = await world.runAdmitted("cut-1", 1);
    expect(replacement.body).toMatchObject({ reward: 1, answer: "42" });
    const calls = await callsOf("cut-1");
    expect(calls.map((c) => [c.capture_key, c.message_count, c.delivered])).toEqual([
      ["cut-1", 2, true],
      ["cut-1", 4, false],
      ["cut-1-a1", 4, true],
    ]);
    expect(calls[2]!.continued_from).toBe(inflight!.model_call_id);
    expect(calls[2]!.parent_call_id).toBe(first!.model_call_id);
    expect((await world.status("model")).extras).toMatchObject({ restored_generation_cuts: 0 });
    // The continued lineage lives under the next attempt's key; the source ledger was retired.
    expect((await ledgerOf("cut-1-a1")).map((r) => [r.capture_key, r.model_call_id, r.parent_call_id, r.continued_from])).toEqual([
      ["cut-1", first!.model_call_id, null, null],
      ["cut-1-a1", calls[2]!.model_call_id, first!.model_call_id, inflight!.model_call_id],
    ]);
    expect(await ledgerOf("cut-1")).toEqual([]);
  });

  it("restoring the same checkpoint twice after the replacement made calls keeps the lineage rooted at the source's delivered call", async () => {
    const task = { expression: "2 + 3", tool_rounds: 2 };
    const { run: lost } = await startUntilHeld("twice-1", 2, 0, task);
    await world.checkpointNoResume("cp-twice-1", [ep("twice-1")]);
    const [first] = await callsOf("twice-1");
    await world.crashAndRestart("cp-twice-1");
    await world.backend.release();
    await lost;
    await world.restoreAndResume("cp-twice-1", [ep("twice-1")]);
    // The replacement makes one delivered call (continuing the cut), then its next call is held: crash.
    await world.backend.hold(3);
    const dead = world.run("twice-1", 1, task).catch((error: unknown) => ({ status: 0, body: { lost: String(error) } }));
    await world.waitFor(async () => (await callsOf("twice-1")).length >= 4, "the dead replacement's second call");
    const deadCalls = await callsOf("twice-1");
    expect(deadCalls.slice(2).map((c) => [c.capture_key, c.message_count, c.delivered])).toEqual([
      ["twice-1-a1", 4, true],
      ["twice-1-a1", 6, false],
    ]);
    expect((await ledgerOf("twice-1-a1")).map((r) => r.model_call_id)).toEqual([first!.model_call_id, deadCalls[2]!.model_call_id]);
    await world.crashAndRestart();
    await world.backend.release();
    await dead;
    await world.restoreAndResume("cp-twice-1", [ep("twice-1")]);
    const replacement = await world.runAdmitted("twice-1", 1, task);
    expect(replacement.body).toMatchObject({ reward: 1, answer: "5" });
    const calls = await callsOf("twice-1");
    const again = calls.slice(4);
    expect(again.map((c) => [c.capture_key, c.message_count])).toEqual([
      ["twice-1-a1", 4],
      ["twice-1-a1", 6],
    ]);
    expect(again[0]!.parent_call_id).toBe(first!.model_call_id);
    expect(again[0]!.continued_from).toBe(calls[1]!.model_call_id);
    // Dead-run calls are not in the lineage.
    const lineage = (await ledgerOf("twice-1-a1")).map((r) => r.model_call_id);
    expect(lineage).toEqual([first!.model_call_id, again[0]!.model_call_id, again[1]!.model_call_id]);
    expect(lineage).not.toContain(deadCalls[2]!.model_call_id);
  });
});
