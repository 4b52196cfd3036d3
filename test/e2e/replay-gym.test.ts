import { mkdtemp, readFile, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { startChildProgram, type ChildProgram } from "../../coordinator/local/child-program.js";
import { IndexHeaderSchema, ReplayTaskSource, TraceRecordSchema, exportCheckpointSeeds, gymSourceEnvironment } from "../../participants/replay/index.js";
import { DEFAULT_RECHECK_PROMPT } from "../../participants/replay/replay-config.js";
import { CONTROLLER_TOKEN, GYM_TOKEN, TASK, startGymWorld, type GymWorld } from "../support/gym-processes.js";
import { spawnServer } from "./model-processes.js";

/**
 * Replay wired into the reference Gym, all real processes: `gym-ckpt collect --records-dir` writes
 * rollout records from the environment's `/run` trajectories while a follow-mode replay source on
 * the same glob picks up each new step; the environment server (started with --replay-config on
 * that directory) serves the replayed tasks and runs them from their seeded context; a published
 * checkpoint's parked episode is exported as a `continue` seed; a second environment server serves
 * the same records in `recheck` mode. The tests run in order: the served-replay and recheck tests
 * use the records the collection test wrote.
 */
const CLI = fileURLToPath(new URL("../../dist/coordinator/cli/main.js", import.meta.url));
const REPLAY_MAIN = fileURLToPath(new URL("../../dist/participants/replay/main.js", import.meta.url));
const silent = pino({ level: "silent" });
const GLOB = "rollouts/step_*/train_rollouts_gym.jsonl";
const ROWS = 7;
const expressionOf = (i: number) => `${10 + i} * 2`;

let world: GymWorld;
let recordsDir: string;
const children: ChildProgram[] = [];

beforeAll(async () => {
  recordsDir = await mkdtemp(join(tmpdir(), "gym-ckpt-replay-e2e-"));
  const config = { records: GLOB, source: { id: "reference-gym" }, mode: "continue", anchor: "tool-call", max_anchors: null, wait_for_step_marker: true };
  await writeFile(join(recordsDir, "replay.json"), JSON.stringify(config));
  world = await startGymWorld({ args: { environment: ["--replay-config", join(recordsDir, "replay.json")] } });
}, 60_000);

afterAll(async () => {
  await Promise.allSettled(children.splice(0).map((c) => c.kill("SIGKILL")));
  await world?.close();
  await rm(recordsDir, { recursive: true, force: true });
});

function follower() {
  return new ReplayTaskSource({ records: GLOB, source: { id: "reference-gym" }, mode: "continue", anchor: "tool-call", max_anchors: null, wait_for_step_marker: true }, gymSourceEnvironment, {
    cwd: recordsDir,
    logger: silent,
  });
}

async function runWith(body: object, trajectory = true) {
  const response = await fetch(`${world.gym.urls.environment}/run`, {
    method: "POST",
    headers: { "content-type": "application/json", ...(trajectory && { "x-ng-trajectory": "1" }) },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as any };
}

describe("replay on the reference Gym", () => {
  it("collect writes rollout records step by step while a follow-mode replay source picks up each new step", async () => {
    await world.backend.reset();
    const tasks = Array.from({ length: ROWS }, (_, i) => JSON.stringify({ id: `rec-${i}`, task: { expression: expressionOf(i), tool_rounds: 1 } }));
    await writeFile(join(recordsDir, "tasks.jsonl"), `${tasks.join("\n")}\n`);
    // Two model calls per row, one row at a time: the 7th call (row 4's first) is held, after step_1 (rows 0–2) is out.
    await world.backend.hold(6);
    const collect = await startChildProgram(CLI, [
      "collect",
      ...["--nats-url", world.nats.server.url, "--deployment", world.deployment, "--token", CONTROLLER_TOKEN],
      ...["--tasks", join(recordsDir, "tasks.jsonl"), "--out", join(recordsDir, "results.jsonl"), "--checkpoint-dir", world.root],
      ...["--run-url", `${world.gym.urls.environment}/run`, "--concurrency", "1"],
      ...["--records-dir", recordsDir, "--records-env", "gym", "--records-kind", "train", "--records-every-rows", "3", "--records-every-s", "600"],
    ]);
    children.push(collect);
    let exited = false;
    void collect.exited.then(() => (exited = true));

    const live = follower();
    await world.waitFor(async () => (await live.reload()).total > 0, "the follower to load step_1 while the collection runs", 30_000);
    expect(exited).toBe(false);
    expect(live.size).toBe(3); // one tool-call anchor per row: after its single complete tool run
    expect(live.tasks.map((t) => [t.lineage.sourceStep, t.task.expression])).toEqual([0, 1, 2].map((i) => [1, expressionOf(i)]));

    await world.backend.release();
    expect((await collect.exited).code).toBe(0);
    await live.reload();
    // 7 rows → steps of 3, 3 and the final flush of 1.
    expect(live.size).toBe(ROWS);
    expect(new Set(live.tasks.map((t) => t.lineage.sourceStep))).toEqual(new Set([1, 2, 3]));
    expect(live.stats.read.filesIndexed).toBe(3);
    const late = follower();
    await late.load();
    expect(live.tasks).toEqual(late.tasks);

    // The record itself: the conversation as a linear graph, seeded prompt unsampled, model turns sampled.
    const lines = (await readFile(join(recordsDir, "rollouts", "step_1", "train_rollouts_gym.jsonl"), "utf8")).trimEnd().split("\n");
    const first = TraceRecordSchema.parse(JSON.parse(lines[0]!));
    expect(first.task).toEqual({ expression: expressionOf(0), tool_rounds: 1, idx: 0, name: null, prompt: `Compute: ${expressionOf(0)}` });
    expect(first.nodes.map((n) => [n.message.role, n.sampled, n.parent])).toEqual([
      ["system", false, null],
      ["user", false, 0],
      ["assistant", true, 1],
      ["tool", false, 2],
      ["assistant", true, 3],
    ]);
    expect(first.rewards).toEqual({ reward: 1 });
    expect(first.info).toMatchObject({ rollout_id: "rec-0", attempt: 0 });
    const header = IndexHeaderSchema.parse(JSON.parse((await readFile(join(recordsDir, "rollouts", "step_1", "index_train_gym.jsonl"), "utf8")).split("\n")[0]!));
    expect(header).toMatchObject({ kind: "train", env: "gym", step: 1, records: 3 });
    // results.jsonl keeps the reply without the trajectory.
    const result = JSON.parse((await readFile(join(recordsDir, "results.jsonl"), "utf8")).split("\n")[0]!);
    expect(Object.keys(result.response).sort()).toEqual(["answer", "attempt", "continued_from", "reward", "rollout_id"]);
  }, 90_000);

  it("the environment server serves the replay source and runs a replayed task from its seeded context", async () => {
    await world.backend.reset();
    const next = await (await fetch(`${world.gym.urls.environment}/replay/next`, { method: "POST" })).json() as any;
    expect(next).toMatchObject({ done: false, replay_idx: 0, task: { expression: expressionOf(0), tool_rounds: 1 } });
    expect(next.name).toMatch(/^continue:[0-9a-f]{8}:tool-call3$/);
    expect(next.seed.map((m: any) => m.role)).toEqual(["user", "assistant", "tool"]);
    expect(next.lineage).toMatchObject({ mode: "continue", anchor: "tool-call", sourceEnv: "reference-gym", sourceStep: 1, anchorNode: 3 });

    const reply = await runWith({ rollout_id: "replayed-0", attempt: 0, task: next.task, replay_idx: next.replay_idx, replay_id: next.replay_id });
    expect(reply.status).toBe(200);
    expect(reply.body).toMatchObject({ rollout_id: "replayed-0", reward: 1, answer: "20", continued_from: null });
    const t = reply.body.trajectory;
    expect(t.task_name).toBe(next.name);
    expect(t.replay).toMatchObject({ sourceTraceId: next.lineage.sourceTraceId, anchorNode: 3 });
    // system + the 3 seeded messages are context; only the new answer was sampled.
    expect(t.nodes.map((n: any) => [n.message.role, n.sampled])).toEqual([
      ["system", false],
      ["user", false],
      ["assistant", false],
      ["tool", false],
      ["assistant", true],
    ]);
    expect(t.turns).toBe(1);
    // One model call, made with the seeded context (system, user, assistant, tool).
    const calls = (await world.backend.calls()).filter((c) => c.capture_key === "replayed-0");
    expect(calls.map((c) => c.message_count)).toEqual([4]);

    // A task that differs from the replay task's, or an index past the end, is refused.
    expect(await runWith({ rollout_id: "replayed-1", attempt: 0, task: TASK, replay_idx: 0, replay_id: next.replay_id })).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    expect(await runWith({ rollout_id: "replayed-2", attempt: 0, task: TASK, replay_idx: 999, replay_id: next.replay_id })).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    // Without the header the reply is unchanged.
    expect((await runWith({ rollout_id: "plain-0", attempt: 0, task: TASK }, false)).body).toEqual({ rollout_id: "plain-0", attempt: 0, reward: 1, answer: "42", continued_from: null });
  }, 60_000);

  it("exports a published checkpoint's parked episode as a continue seed (library and CLI)", async () => {
    await world.backend.reset();
    await world.backend.hold(1);
    const running = world.run("seeds-1");
    await world.waitFor(async () => (await world.backend.calls()).length >= 2, "the second model call to be held");
    await world.checkpointNoResume("cp-seeds-1", [{ rollout_id: "seeds-1", attempt: 0 }]);
    const dir = new CheckpointCatalog(world.root).dirFor("cp-seeds-1");
    try {
      const exported = await exportCheckpointSeeds(dir, { tasks: [TASK, { expression: "1 + 1", tool_rounds: 1 }] });
      expect(exported.checkpointId).toBe("cp-seeds-1");
      expect(exported.seeds).toHaveLength(1);
      const seed = exported.seeds[0]!;
      expect(seed.name).toBe("continue:cp-seeds-1:seeds-1");
      expect(seed.task).toEqual(TASK);
      expect(Array.isArray(seed.prompt) && seed.prompt.map((m) => m.role)).toEqual(["user", "assistant", "tool"]);
      expect(seed.lineage).toEqual({
        mode: "continue",
        anchor: "checkpoint-boundary",
        source_checkpoint_id: "cp-seeds-1",
        capture_key: "seeds-1",
        rollout_id: "seeds-1",
        attempt: 0,
        boundary: "invoke_agent",
        task_digest: expect.stringMatching(/^[0-9a-f]{64}$/),
        turns: 1,
      });

      const out = join(recordsDir, "seeds.jsonl");
      const stdout: string[] = [];
      const seeds = await startChildProgram(REPLAY_MAIN, ["seeds", "--checkpoint", dir, "--out", out, "--tasks", join(recordsDir, "tasks.jsonl")], {
        onLine: (line, stream) => void (stream === "stdout" && stdout.push(line)),
      });
      children.push(seeds); // killed in teardown if it hangs
      const closed = new Promise<void>((resolve) => seeds.child.once("close", () => resolve())); // every stdout line read
      expect((await seeds.exited).code).toBe(0);
      await closed;
      expect(JSON.parse(stdout.join("\n"))).toMatchObject({ checkpoint_id: "cp-seeds-1", seeds: 1 });
      const lines = (await readFile(out, "utf8")).trimEnd().split("\n").map((l) => JSON.parse(l));
      // The task file holds other tasks only: the seed keeps its digest but no task.
      expect(lines).toEqual([{ ...seed, task: null }]);
    } finally {
      await world.client.resume({ checkpoint_id: "cp-seeds-1" });
      await world.backend.release();
    }
    expect((await running).body).toMatchObject({ reward: 1, answer: "42" });
  }, 60_000);

  // Last: its extra environment participant would otherwise take part in the checkpoint above.
  it("a recheck replay of a correct collected rollout runs through the reference Gym and scores it again", async () => {
    await world.backend.reset();
    await writeFile(join(recordsDir, "recheck.json"), JSON.stringify({ records: GLOB, source: { id: "reference-gym" }, mode: "recheck" }));
    const recheck = await spawnServer("environment-recheck", "dist/participants/gym/environment-server/main.js", [
      ...["--nats", world.nats.server.url, "--deployment", world.deployment, "--instance", "environment-recheck", "--token", GYM_TOKEN, "--port", "0"],
      ...["--checkpoint-root", world.root, "--agent-url", world.gym.urls.agent!, "--resources-url", world.gym.urls.resources!],
      ...["--replay-config", join(recordsDir, "recheck.json")],
    ]);
    try {
      const next = (await (await fetch(`${recheck.url}/replay/next`, { method: "POST" })).json()) as any;
      expect(next).toMatchObject({ done: false, replay_idx: 0, task: { expression: expressionOf(0), tool_rounds: 1 }, lineage: { mode: "recheck" } });
      expect(next.name).toMatch(/^recheck:[0-9a-f]{8}$/);
      // The finished attempt (it answered correctly, reward 1) plus the "check your work" turn.
      expect(next.seed.map((m: any) => m.role)).toEqual(["user", "assistant", "tool", "assistant", "user"]);
      expect(next.seed.at(-1).content).toBe(DEFAULT_RECHECK_PROMPT);

      const response = await fetch(`${recheck.url}/run`, {
        method: "POST",
        headers: { "content-type": "application/json", "x-ng-trajectory": "1" },
        body: JSON.stringify({ rollout_id: "recheck-0", attempt: 0, task: next.task, replay_idx: next.replay_idx, replay_id: next.replay_id }),
      });
      const reply = (await response.json()) as any;
      expect(response.status).toBe(200);
      // The policy redid the task's calculation (not the recheck sentence) and answered again.
      expect(reply).toMatchObject({ rollout_id: "recheck-0", reward: 1, answer: "20" });
      expect(reply.trajectory.task_name).toBe(next.name);
      expect(reply.trajectory.nodes.map((n: any) => [n.message.role, n.sampled])).toEqual([
        ["system", false],
        ...next.seed.map((m: any) => [m.role, false]),
        ["assistant", true],
        ["tool", false],
        ["assistant", true],
      ]);
      const calls = (await world.backend.calls()).filter((c) => c.capture_key === "recheck-0");
      expect(calls.map((c) => c.message_count)).toEqual([6, 8]);
    } finally {
      await recheck.kill("SIGTERM");
    }
  }, 60_000);
});
