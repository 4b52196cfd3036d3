import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { exportCheckpointSeeds } from "../../participants/replay/index.js";
import { TRAJECTORY_HEADER } from "../../protocol/index.js";
import { TASK, startGymWorld, type BackendCall, type GymWorld } from "../support/gym-processes.js";
import { ep } from "../support/episode.js";

/**
 * A reasoning policy through the reference Gym, all real processes: the backend answers as newer vLLM
 * does (its thought under `reasoning`). The agent keeps it on its assistant turns as reasoning_content:
 * in the parked conversation a checkpoint holds (and the seed exported from it), in the call a restored
 * episode continues (whose conversation digest still matches the cut one, so it continues the cut
 * generation), and in the /run trajectory.
 */
let world: GymWorld;

beforeAll(async () => {
  world = await startGymWorld({ args: { policy: ["--reasoning-field", "reasoning"] } });
}, 60_000);
afterAll(async () => {
  await world?.close();
});

const TOOL_THOUGHT = 'Call calculator with {"expression":"17 + 25"}.';
type FullCall = BackendCall & { model_call_id: string };

describe("reference Gym with a reasoning policy", () => {
  it("keeps the model's reasoning in the checkpoint, its seed, the continued call and the trajectory", async () => {
    await world.backend.hold(1); // the second model call: parked after one complete tool run
    const lost = world.run("think-1").catch((error: unknown) => ({ status: 0, body: { lost: String(error) } }));
    await world.waitFor(async () => (await world.backend.calls()).length >= 2, "the second model call to be held");
    await world.checkpointNoResume("cp-think-1", [ep("think-1")]);

    const exported = await exportCheckpointSeeds(new CheckpointCatalog(world.root).dirFor("cp-think-1"));
    expect(exported.seeds.map((s) => s.prompt)).toEqual([
      [
        { role: "user", content: "Compute: 17 + 25" },
        { role: "assistant", content: null, reasoning_content: TOOL_THOUGHT, tool_calls: [{ id: "call_1", name: "calculator", arguments: '{"expression":"17 + 25"}' }] },
        { role: "tool", tool_call_id: "call_1", content: '{"result":"42"}' },
      ],
    ]);

    await world.crashAndRestart("cp-think-1");
    await world.backend.release();
    expect((await lost).status).not.toBe(200);
    await world.restoreAndResume("cp-think-1", [ep("think-1")]);
    const { body: replacement } = await world.runAdmitted("think-1", 1, TASK, "environment", { [TRAJECTORY_HEADER]: "1" });
    expect(replacement).toMatchObject({ attempt: 1, reward: 1, answer: "42", continued_from: "invoke_agent" });
    // The restored call sent the parked conversation, reasoning included: the model proxy matched its
    // digest to the cut generation's and continued it.
    const calls = ((await world.backend.calls()) as FullCall[]).filter((c) => c.capture_key?.startsWith("think-1"));
    expect(calls.map((c) => [c.capture_key, c.message_count])).toEqual([
      ["think-1", 2],
      ["think-1", 4],
      ["think-1-a1", 4],
    ]);
    expect(calls[2]!.continued_from).toBe(calls[1]!.model_call_id);
    expect(replacement.trajectory.nodes.map((n: any) => n.message.reasoning_content ?? null)).toEqual([null, null, TOOL_THOUGHT, null, "Answer 42."]);
    await world.client.forget({ rollout_ids: ["think-1"] });
  }, 90_000);
});
