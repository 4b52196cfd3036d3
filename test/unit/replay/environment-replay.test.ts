import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { createEnvironmentApp } from "../../../participants/gym/environment-server/environment-server.js";
import { canonicalDigest } from "../../../protocol/index.js";
import { EnvironmentKind } from "../../../participants/kinds/environment/index.js";
import { ReplayTaskSource, gymSourceEnvironment, writeRolloutRecords, type GymReplaySource } from "../../../participants/replay/index.js";
import { gymReplayRun } from "../../../participants/replay/gym-replay-source.js";
import { gymSourceEnvironment as gymEnvironment } from "../../../participants/replay/gym-replay-source.js";
import { TraceBuilder, call, result, say, silent, sys, tempDir, traceId, user } from "./fixtures.js";

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(() => cleanup());

const TASK = { expression: "3 * 4", tool_rounds: 2 };

/** One Gym rollout with two complete tool runs: two continue anchors of the same task. */
async function writeGymRecords(step: number, id: number, task: object = TASK): Promise<void> {
  const b = new TraceBuilder();
  b.chain(null, [[sys()], [user("Compute: 3 * 4")], [call("c1"), true], [result("c1", "12")], [call("c2"), true], [result("c2", "12")], [say("12"), true]]);
  const trace = { ...b.trace(traceId(id)), task: { ...task, idx: 0, name: null, prompt: "Compute: 3 * 4" } };
  await writeRolloutRecords(path.join(dir, "rollouts"), step, { kind: "train", env: "gym", traces: [trace] });
}

/** The app with a stand-in kind: it records the restore digest input instead of running an episode. */
async function appWith(replay: GymReplaySource, options: { maxSeedBytes?: number } = {}) {
  const begun: unknown[] = [];
  const kind = {
    statusExtras: () => ({}),
    begin: async (episode: { rollout_id: string; attempt: number }, digested: unknown) => {
      begun.push(digested);
      return { ...episode, reward: 1, answer: "12", continued_from: null, messages: [] };
    },
  } as unknown as EnvironmentKind;
  const app = createEnvironmentApp({ kind, endpoints: {} as never, replay, ...options });
  await app.ready();
  return { app, begun };
}

function source(): GymReplaySource {
  return new ReplayTaskSource({ records: "rollouts/step_*/train_rollouts_gym.jsonl", source: { id: "reference-gym" }, anchor: "tool-call", max_anchors: null }, gymSourceEnvironment, { cwd: dir, logger: silent });
}

describe("the environment server's replay path", () => {
  it("/run names a replay task by index and content id: an index whose task has another id is refused, and the id goes into the restore digest", async () => {
    await writeGymRecords(1, 7);
    const { app, begun } = await appWith(source());
    const next = async () => (await app.inject({ method: "POST", url: "/replay/next" })).json();
    const first = await next();
    const second = await next();
    expect([first.replay_idx, second.replay_idx]).toEqual([0, 1]);
    expect(first.task).toEqual(second.task); // both anchors share the task: it cannot tell them apart
    expect(first.replay_id).toMatch(/^[0-9a-f]{64}$/);
    expect(second.replay_id).not.toBe(first.replay_id);
    const run = (body: object) => app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r", attempt: 0, task: TASK, ...body } });

    // A worker whose list disagrees: index 0 with task 1's id.
    const crossed = await run({ replay_idx: 0, replay_id: second.replay_id });
    expect(crossed.statusCode).toBe(400);
    expect(crossed.json()).toMatchObject({ error: { code: "invalid_request" } });
    // The id is required with the index.
    expect((await run({ replay_idx: 0 })).json()).toMatchObject({ error: { code: "invalid_request" } });
    expect((await run({ replay_id: first.replay_id })).json()).toMatchObject({ error: { code: "invalid_request" } });
    expect(begun).toEqual([]); // no refusal began an episode

    expect((await run({ replay_idx: 1, replay_id: second.replay_id })).statusCode).toBe(200);
    expect(begun).toEqual([{ task: TASK, replay_idx: 1, replay_id: second.replay_id }]);
    await app.close();
  });

  it("a restored replayed record digested with or without the task's defaults continues under its replay task only", async () => {
    await writeGymRecords(1, 7, { expression: "3 * 4", tool_rounds: 1 });
    const replay = source();
    await replay.load();
    const asParsed = { expression: "3 * 4", tool_rounds: 1 }; // what servers before the as-spelled digest recorded
    const asSpelled = { expression: "3 * 4" };
    for (const [recorded, sent] of [[asParsed, asSpelled], [asSpelled, asParsed]]) {
      const kind = new EnvironmentKind();
      const app = createEnvironmentApp({ kind, endpoints: { agentUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9" }, replay });
      try {
        const anchor = (idx: number) => ({ replay_idx: idx, replay_id: gymReplayRun(replay.tasks[idx]!).replay_id });
        const [first, second] = [anchor(0), anchor(1)];
        // A bogus boundary is refused only after the digest matched: invalid_checkpoint_state says it did.
        await kind.install([{ episode_id: { rollout_id: "r1", attempt: 1 }, task_digest: canonicalDigest({ task: recorded, ...first }), boundary: { next: "bogus" } }]);
        const run = (body: object) => app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 2, task: sent, ...body } });
        for (const other of [{}, second]) {
          const refused = await run(other);
          expect([refused.statusCode, refused.json().error.code]).toEqual([400, "invalid_request"]);
        }
        const res = await run(first);
        expect([res.statusCode, res.json().error.code]).toEqual([422, "invalid_checkpoint_state"]);
        expect(kind.episodes.pendingKeys()).toEqual(["r1-a2"]);
      } finally {
        await app.close();
      }
    }
  });

  it("a replayed /run refused admission_closed has not run the source's setup; an admitted one runs it before its seed", async () => {
    await writeGymRecords(1, 7);
    const setups: string[] = [];
    const environment: typeof gymEnvironment = { ...gymEnvironment, setup: (task) => void setups.push(task.expression) };
    const replay = new ReplayTaskSource({ records: "rollouts/step_*/train_rollouts_gym.jsonl", source: { id: "reference-gym" }, anchor: "tool-call", max_anchors: null }, environment, { cwd: dir, logger: silent });
    await replay.load();
    const kind = new EnvironmentKind();
    // Unreachable callees: an admitted run fails at its seed, after the setup.
    const app = createEnvironmentApp({ kind, endpoints: { agentUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9" }, replay });
    try {
      const run = (rollout_id: string) => app.inject({ method: "POST", url: "/run", payload: { rollout_id, attempt: 0, task: TASK, replay_idx: 0, replay_id: gymReplayRun(replay.tasks[0]!).replay_id } });
      await kind.closeAdmission();
      const refused = await run("r1");
      expect([refused.statusCode, refused.json().error.code]).toEqual([409, "admission_closed"]);
      expect(setups).toEqual([]); // a refusal changed nothing
      await kind.openAdmission();
      const admitted = await run("r2");
      expect(admitted.statusCode).not.toBe(200); // the seed's callee is unreachable
      expect(setups).toEqual(["3 * 4"]);
    } finally {
      await app.close();
    }
  });

  it("a replayed episode restored from a checkpoint continues without running the source's setup again", async () => {
    await writeGymRecords(1, 7);
    const setups: string[] = [];
    const environment: typeof gymEnvironment = { ...gymEnvironment, setup: (task) => void setups.push(task.expression) };
    const replay = new ReplayTaskSource({ records: "rollouts/step_*/train_rollouts_gym.jsonl", source: { id: "reference-gym" }, anchor: "tool-call", max_anchors: null }, environment, { cwd: dir, logger: silent });
    await replay.load();
    const kind = new EnvironmentKind();
    const app = createEnvironmentApp({ kind, endpoints: { agentUrl: "http://127.0.0.1:9", resourcesUrl: "http://127.0.0.1:9" }, replay });
    try {
      const anchor = { replay_idx: 0, replay_id: gymReplayRun(replay.tasks[0]!).replay_id };
      // Checkpointed after its verify: the setup ran in attempt 0, and what it set up was captured then.
      await kind.install([{ episode_id: { rollout_id: "r1", attempt: 0 }, task_digest: canonicalDigest({ task: TASK, ...anchor }), boundary: { next: "return", answer: "12", reward: 1 } }]);
      const res = await app.inject({ method: "POST", url: "/run", payload: { rollout_id: "r1", attempt: 1, task: TASK, ...anchor } });
      expect([res.statusCode, res.json()]).toEqual([200, { rollout_id: "r1", attempt: 1, reward: 1, answer: "12", continued_from: "return" }]);
      expect(setups).toEqual([]);
    } finally {
      await app.close();
    }
  });

  it("a replay task whose seed is larger than the agent's activate takes is passed over by /replay/next and refused by /run before anything runs", async () => {
    // A reasoning policy's turn, as the reference agent now keeps it, outgrowing the seed limit (made
    // small here: MAX_SEED_BYTES of records take seconds to write and read).
    const maxSeedBytes = 64 * 1024;
    const thinking = { ...call("c1"), reasoning_content: "t".repeat(maxSeedBytes) };
    const b = new TraceBuilder();
    b.chain(null, [[sys()], [user("Compute: 3 * 4")], [thinking, true], [result("c1", "12")], [call("c2"), true], [result("c2", "12")], [say("12"), true]]);
    const trace = { ...b.trace(traceId(9)), task: { ...TASK, idx: 0, name: null, prompt: "Compute: 3 * 4" } };
    await writeRolloutRecords(path.join(dir, "rollouts"), 1, { kind: "train", env: "gym", traces: [trace] });
    const replay = source();
    await replay.load();
    const { app, begun } = await appWith(replay, { maxSeedBytes });
    try {
      // Both anchors' seeds hold the long turn: neither is handed out.
      expect((await app.inject({ method: "POST", url: "/replay/next" })).json()).toMatchObject({ done: true, unrunnable: 2 });
      const refused = await app.inject({
        method: "POST",
        url: "/run",
        payload: { rollout_id: "r", attempt: 0, task: TASK, replay_idx: 0, replay_id: gymReplayRun(replay.tasks[0]!).replay_id },
      });
      expect([refused.statusCode, refused.json().error.code]).toEqual([400, "invalid_request"]);
      expect(refused.json().error.detail).toContain(`at most ${maxSeedBytes}`);
      expect(begun).toEqual([]); // nothing ran
    } finally {
      await app.close();
    }
  });

  it("GET /replay/info reloads before it answers, so it reports the tasks on disk now", async () => {
    await writeGymRecords(1, 7);
    const replay = source();
    await replay.load();
    const { app } = await appWith(replay);
    const info = async () => (await app.inject({ method: "GET", url: "/replay/info" })).json();
    expect(await info()).toMatchObject({ tasks: 2, num_tasks: 2 });
    await writeGymRecords(2, 8);
    expect(await info()).toMatchObject({ tasks: 4, num_tasks: 4 });
    await app.close();
  });
});
