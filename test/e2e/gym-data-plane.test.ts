import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { TASK, startGymWorld, startStubPolicy, type GymWorld, type StubPolicy } from "../support/gym-processes.js";

/**
 * The environment, agent and resources servers as real processes, against an in-test policy that
 * follows the reference contract (no model participant): the data plane, bad input, and a crash
 * continued from the agent's boundary.
 */
let world: GymWorld;
let policy: StubPolicy;

beforeAll(async () => {
  policy = await startStubPolicy();
  world = await startGymWorld({ external: { policy: policy.url, model: policy.url } });
});
afterAll(async () => {
  await world?.close();
  await policy?.close();
});

const post = async (url: string, body: unknown) => {
  const response = await fetch(url, { method: "POST", headers: { "content-type": "application/json" }, body: typeof body === "string" ? body : JSON.stringify(body) });
  return { status: response.status, body: (await response.json()) as any };
};

describe("reference Gym data plane", () => {
  it("runs a native episode: seed → agent (model calls [2,4]) → verify → reward 1", async () => {
    const result = await world.run("native-1");
    expect(result).toEqual({ status: 200, body: { rollout_id: "native-1", attempt: 0, reward: 1, answer: "42", continued_from: null } });
    expect(policy.calls.filter((c) => c.capture_key === "native-1").map((c) => c.message_count)).toEqual([2, 4]);
    expect(await world.state("agent")).toMatchObject({ sessions: 0, legacy_episodes: 0 });
    expect(await world.state("environment")).toMatchObject({ episodes: 0, restored_pending: 0 });
  });

  it("runs a legacy /run on the agent, and a wrong answer scores 0", async () => {
    expect((await world.run("legacy-1", 0, TASK, "agent")).body).toMatchObject({ reward: 1, answer: "42" });
    expect((await world.run("rounds-2", 0, { expression: "2 * (3 + 4)", tool_rounds: 2 })).body).toMatchObject({ reward: 1, answer: "14" });
    expect(policy.calls.filter((c) => c.capture_key === "rounds-2").map((c) => c.message_count)).toEqual([2, 4, 6]);
  });

  it("answers bad input with documented codes", async () => {
    const env = world.gym.urls.environment!;
    const agent = world.gym.urls.agent!;
    expect(await post(`${env}/run`, "{nope")).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    expect(await post(`${env}/run`, { rollout_id: "x-a1", attempt: 0, task: TASK })).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    expect(await post(`${env}/run`, { rollout_id: "x", attempt: 0, task: TASK, extra: 1 })).toMatchObject({ status: 400 });
    expect(await post(`${agent}/ng-rollout/..%2Fetc/open_session`, {})).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    expect(await post(`${agent}/ng-rollout/unknown-key/activate`, { task: TASK })).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    expect(await post(`${agent}/ng-rollout/s-1/open_session`, {})).toMatchObject({ status: 200, body: { session_key: "s-1", restored: false } });
    expect(await post(`${agent}/ng-rollout/s-1-a2/open_session`, {})).toMatchObject({ status: 409, body: { error: { code: "stale_attempt" } } });
    expect(await post(`${agent}/ng-rollout/s-1/close_session`, {})).toMatchObject({ status: 200 });
    expect(await world.state("agent")).toMatchObject({ sessions: 0 });
  });

  it("continues a crashed episode from the agent's boundary: the delivered call is not repeated ([2,4,4])", async () => {
    policy.hold(policy.calls.length + 1);
    const before = policy.calls.length;
    const first = world.run("crash-1").catch(() => undefined);
    await world.waitFor(() => policy.calls.length === before + 2, "the second model call");
    await world.checkpointNoResume("cp-stub-1", [{ rollout_id: "crash-1", attempt: 0 }]);
    await world.crashAndRestart("cp-stub-1");
    policy.release();
    await first;
    expect((await world.verify("cp-stub-1")).records).toBeGreaterThanOrEqual(2);
    await world.restoreAndResume("cp-stub-1", [{ rollout_id: "crash-1", attempt: 0 }]);
    expect((await world.run("crash-1", 0)).body.error.code).toBe("stale_attempt");
    const replacement = await world.run("crash-1", 1);
    expect(replacement.body).toEqual({ rollout_id: "crash-1", attempt: 1, reward: 1, answer: "42", continued_from: "invoke_agent" });
    expect(policy.calls.filter((c) => c.capture_key.startsWith("crash-1")).map((c) => [c.capture_key, c.message_count])).toEqual([
      ["crash-1", 2],
      ["crash-1", 4],
      ["crash-1-a1", 4],
    ]);
  });

  it("a server stopped (SIGTERM) while its episodes are parked for a checkpoint still exits on its own", async () => {
    policy.hold(policy.calls.length + 1);
    const before = policy.calls.length;
    const running = world.run("parked-1").catch(() => undefined);
    await world.waitFor(() => policy.calls.length === before + 2, "the second model call");
    const prepared = world.client.prepare({ checkpoint_id: "cp-sigterm-1" });
    policy.release();
    expect((await prepared).prepared).toBe(true); // the episode is parked at its boundary
    const environment = world.gym.processes.get("environment")!;
    const started = Date.now();
    // The launcher's kill() waits for the exit without escalating: before the fix this never returned.
    await world.gym.kill(["environment"], "SIGTERM");
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(environment.child.exitCode ?? environment.child.signalCode).not.toBeNull();
    await running;
    // The others resume; the stopped environment is reported unreachable.
    await expect(world.client.resume({ checkpoint_id: "cp-sigterm-1" })).rejects.toMatchObject({ message: expect.stringContaining("environment/environment: unreachable") });
    await world.gym.start(["environment"]);
    expect((await world.run("after-sigterm-1")).body).toMatchObject({ reward: 1 });
  });
});
