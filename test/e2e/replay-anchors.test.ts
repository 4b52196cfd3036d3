import { mkdtemp, rm, writeFile } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { CheckpointCatalog } from "../../coordinator/publication/checkpoint-catalog.js";
import { MAX_SEED_MESSAGES } from "../../participants/gym/agent-server/tool-calling-agent.js";
import { exportCheckpointSeeds, gymReplayRun, loadGymReplaySource, writeRolloutRecords, type Message, type TraceRecord } from "../../participants/replay/index.js";
import { startGymWorld, type GymWorld } from "../support/gym-processes.js";
import { ep } from "../support/episode.js";
import { verifyHold } from "../support/verify-hold.js";

/**
 * Replay continuation on the reference Gym, all real processes: checkpoint seeds at each boundary
 * an episode can be parked at, a replayed episode restored after a crash (attempt 1) and refusals
 * with their catalog codes that change nothing: a task of another digest, a rollout id already
 * running, an index past the last task, and a seed longer than the agent takes.
 */
let world: GymWorld;
let recordsDir: string;
const GYM_TASK = { expression: "6 * 7", tool_rounds: 2 };
const RECORDS = "rollouts/step_*/train_rollouts_gym.jsonl";

type Turn = [message: Message, sampled: boolean];
const toolRun = (id: string): Turn[] => [
  [{ role: "assistant", content: null, tool_calls: [{ id, name: "calculator", arguments: JSON.stringify({ expression: "6 * 7" }) }] }, true],
  [{ role: "tool", tool_call_id: id, content: "42" }, false],
];

/** A finished reference-Gym rollout of `runs` complete tool runs: one continue anchor after each. */
function gymTrace(id: string, runs: number): TraceRecord {
  const turns: Turn[] = [
    [{ role: "system", content: "sys" }, false],
    [{ role: "user", content: "Compute: 6 * 7" }, false],
    ...Array.from({ length: runs }, (_, i) => toolRun(`c${i}`)).flat(),
    [{ role: "assistant", content: "42" }, true],
  ];
  return {
    id,
    task: { ...GYM_TASK, idx: 0, name: null, prompt: "Compute: 6 * 7" },
    nodes: turns.map(([message, sampled], i) => ({ parent: i === 0 ? null : i - 1, message, sampled, token_ids: [], mask: [], logprobs: [] })),
    rewards: { reward: 1 },
    metrics: {},
    info: {},
    is_completed: true,
    stop_condition: null,
    errors: [],
  };
}

beforeAll(async () => {
  recordsDir = await mkdtemp(join(tmpdir(), "gym-ckpt-replay-anchors-"));
  await writeRolloutRecords(join(recordsDir, "rollouts"), 1, { kind: "train", env: "gym", traces: [gymTrace("a".repeat(32), 2)] });
  await writeFile(join(recordsDir, "replay.json"), JSON.stringify({ records: RECORDS, source: { id: "reference-gym" }, mode: "continue", anchor: "tool-call", max_anchors: null }));
  world = await startGymWorld({ args: { environment: ["--replay-config", join(recordsDir, "replay.json")] } });
}, 60_000);

afterAll(async () => {
  await world?.close();
  await rm(recordsDir, { recursive: true, force: true });
});

async function post(path: string, body: object = {}) {
  const response = await fetch(`${world.gym.urls.environment}${path}`, {
    method: "POST",
    headers: { "content-type": "application/json", "x-ng-trajectory": "1" },
    body: JSON.stringify(body),
  });
  return { status: response.status, body: (await response.json()) as any };
}

const resources = async (path: string) => (await (await fetch(`${world.gym.urls.resources}${path}`)).json()) as any;
const seedsOf = (id: string, tasks: unknown[] = []) => exportCheckpointSeeds(new CheckpointCatalog(world.root).dirFor(id), { tasks });

describe("replay anchors on the reference Gym", () => {
  it.each([
    { via: "environment" as const, name: "digest", boundary: "invoke_agent" },
    { via: "agent" as const, name: "legacy-digest", boundary: "loop" }, // a legacy agent /run episode
  ])("a checkpoint seed of an episode run through the $via carries the task it was run with, as the task file spells it (a default left out)", async ({ via, name, boundary }) => {
    await world.backend.reset();
    await world.backend.hold(1); // the second model call: parked after one complete tool run
    const task = { expression: "17 + 25" }; // tool_rounds left to its default
    const running = world.run(`${name}-1`, 0, task, via);
    await world.waitFor(async () => (await world.backend.calls()).length >= 2, "the second model call to be held");
    await world.checkpointNoResume(`cp-${name}`, [ep(`${name}-1`)]);
    try {
      const exported = await seedsOf(`cp-${name}`, [task]);
      expect(exported.seeds.map((s) => [s.lineage.boundary, s.task])).toEqual([[boundary, task]]);
    } finally {
      await world.client.resume({ checkpoint_id: `cp-${name}` });
      await world.backend.release();
    }
    expect((await running).body).toMatchObject({ reward: 1, answer: "42" });
  }, 60_000);

  it("an episode parked before its first model call or at verify is no seed", async () => {
    await world.backend.reset();
    await world.backend.hold(0);
    const first = world.run("first-1");
    await world.waitFor(async () => (await world.backend.calls()).length >= 1, "the first model call to be held");
    await world.checkpointNoResume("cp-first", [ep("first-1")]);
    expect(await seedsOf("cp-first")).toMatchObject({ seeds: [], skipped: { no_progress: 1 } });
    await world.client.resume({ checkpoint_id: "cp-first" });
    await world.backend.release();
    expect((await first).body).toMatchObject({ reward: 1 });

    const before = (await resources("/admin/stats")).verify_started;
    await verifyHold(world.gym.urls.resources!, true);
    const verifying = world.run("verify-1");
    await world.waitFor(async () => (await resources("/admin/stats")).verify_started > before, "verify to start");
    await world.checkpointNoResume("cp-verify", [ep("verify-1")]);
    expect(await seedsOf("cp-verify")).toMatchObject({ seeds: [], skipped: { past_agent: 1 } });
    await world.client.resume({ checkpoint_id: "cp-verify" });
    await verifyHold(world.gym.urls.resources!, false);
    expect((await verifying).body).toMatchObject({ reward: 1 });
  }, 60_000);

  it("a replayed episode restored after a crash continues as attempt 1 under its replay task only", async () => {
    const first = (await post("/replay/next")).body;
    const second = (await post("/replay/next")).body;
    expect([first.replay_idx, second.replay_idx, first.seed.length, second.seed.length]).toEqual([0, 1, 3, 5]);
    // An index past the last task, and a rollout id already running, are refused before anything runs.
    expect(await post("/run", { rollout_id: "past-1", attempt: 0, task: first.task, replay_idx: 2, replay_id: first.replay_id })).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    await world.backend.reset();
    await world.backend.hold(0);
    const lost = post("/run", { rollout_id: "rr-1", attempt: 0, task: first.task, replay_idx: 0, replay_id: first.replay_id }).catch(() => undefined);
    await world.waitFor(async () => (await world.backend.calls()).length >= 1, "the replayed episode's model call to be held");
    for (const attempt of [0, 1]) {
      const duplicate = await post("/run", { rollout_id: "rr-1", attempt, task: second.task, replay_idx: 1, replay_id: second.replay_id });
      expect(duplicate).toMatchObject({ status: 409, body: { error: { code: "stale_attempt" } } });
    }
    expect(await world.state("environment")).toMatchObject({ episodes: 1, restored_pending: 0 });
    await world.checkpointNoResume("cp-replayed", [ep("rr-1")]);
    await world.crashAndRestart("cp-replayed");
    await lost;
    await world.backend.release();
    await world.backend.reset();
    await world.restoreAndResume("cp-replayed", [ep("rr-1")]);
    // Another task, or the other anchor of the same record, is not what was checkpointed: the record stays.
    for (const body of [{ task: first.task }, { task: second.task, replay_idx: 1, replay_id: second.replay_id }]) {
      expect(await post("/run", { rollout_id: "rr-1", attempt: 1, ...body })).toMatchObject({ status: 400, body: { error: { code: "invalid_request" } } });
    }
    expect(await world.state("environment")).toMatchObject({ episodes: 0, restored_pending: 1 });
    const reply = await post("/run", { rollout_id: "rr-1", attempt: 1, task: first.task, replay_idx: 0, replay_id: first.replay_id });
    expect(reply.body).toMatchObject({ rollout_id: "rr-1", attempt: 1, reward: 1, continued_from: "invoke_agent" });
    expect(reply.body.trajectory.task_name).toBe(first.name);
    // The seeded context stays prompt after the restore; only this episode's turns are sampled.
    expect(reply.body.trajectory.nodes.map((n: any) => [n.message.role, n.sampled])).toEqual([
      ["system", false],
      ["user", false],
      ["assistant", false],
      ["tool", false],
      ["assistant", true],
      ["tool", false],
      ["assistant", true],
    ]);
    expect((await world.backend.calls()).map((c) => [c.capture_key, c.message_count])).toEqual([["rr-1-a1", 4], ["rr-1-a1", 6]]);
  }, 90_000);

  /** Serves /replay/next until it is done: the tasks it handed out, and its done reply. */
  const drainNext = async () => {
    const served: any[] = [];
    for (let i = 0; i < 100; i++) {
      const next = (await post("/replay/next")).body;
      if (next.done) return { served, done: next };
      served.push(next);
    }
    throw new Error("/replay/next handed out 100 tasks");
  };
  /** The tasks of `traceId` as every worker of this config lists them (indices include the ones /replay/next passes over). */
  const listedTasks = async (traceId: string) => {
    const source = await loadGymReplaySource(join(recordsDir, "replay.json"));
    const tasks = [];
    for (let i = 0; i < source.size; i++) {
      const task = await source.taskAt(i);
      if (task.lineage.sourceTraceId === traceId) tasks.push(gymReplayRun(task));
    }
    return tasks;
  };

  it("a replay task whose seed is longer than the agent takes is passed over by /replay/next and refused by /run before anything runs", async () => {
    await writeRolloutRecords(join(recordsDir, "rollouts"), 2, { kind: "train", env: "gym", traces: [gymTrace("b".repeat(32), 31)] });
    const { served, done } = await drainNext();
    const listed = await listedTasks("b".repeat(32));
    const long = listed.filter((t) => t.seed.length > MAX_SEED_MESSAGES);
    expect(long.length).toBeGreaterThan(0);
    // /replay/next handed out every task of the record /run takes, and none it refuses.
    expect(served.filter((t) => t.lineage.sourceTraceId === "b".repeat(32)).map((t) => t.replay_idx)).toEqual(listed.filter((t) => t.seed.length <= MAX_SEED_MESSAGES).map((t) => t.replay_idx));
    expect(done.unrunnable).toBe(long.length);
    const last = long.at(-1)!;
    const before = await resources("/admin/stats");
    const refused = await post("/run", { rollout_id: "long-1", attempt: 0, task: last.task, replay_idx: last.replay_idx, replay_id: last.replay_id });
    expect(refused).toMatchObject({ status: 400, body: { error: { code: "invalid_request", detail: expect.stringContaining(`${MAX_SEED_MESSAGES}`) } } });
    // Nothing ran: no session was seeded at the resources server, no episode is tracked.
    expect(await resources("/admin/stats")).toEqual(before);
    expect(await world.state("environment")).toMatchObject({ episodes: 0 });
  }, 60_000);

  it("a replay task anchored at a sandbox snapshot the reference Gym cannot restore is passed over by /replay/next and refused by /run before anything runs", async () => {
    // The record carries a snapshot ref at its first tool result: only that anchor is offered, with the ref.
    const snapshotted = { ...gymTrace("c".repeat(32), 2), info: { snapshots: { "3": "sandbox-snap-1" } } };
    await writeRolloutRecords(join(recordsDir, "rollouts"), 3, { kind: "train", env: "gym", traces: [snapshotted] });
    const { served, done } = await drainNext();
    expect(served.filter((t) => t.lineage.sourceTraceId === "c".repeat(32))).toEqual([]); // passed over: /run would refuse it
    const listed = await listedTasks("c".repeat(32));
    expect(listed.map((t) => t.lineage.anchorNode)).toEqual([3]);
    expect(done.unrunnable).toBeGreaterThanOrEqual(1);
    const task = listed[0]!;
    const before = await resources("/admin/stats");
    const refused = await post("/run", { rollout_id: "snap-1", attempt: 0, task: task.task, replay_idx: task.replay_idx, replay_id: task.replay_id });
    expect(refused).toMatchObject({ status: 400, body: { error: { code: "invalid_request", detail: expect.stringContaining("sandbox-snap-1") } } });
    expect(await resources("/admin/stats")).toEqual(before);
    expect(await world.state("environment")).toMatchObject({ episodes: 0 });
  }, 60_000);
});
