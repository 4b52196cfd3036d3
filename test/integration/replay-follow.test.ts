import path from "node:path";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { RecordWriter, ReplayTaskSource, type TraceRecord } from "../../participants/replay/index.js";
import { call, linearTrace, mathSource, result, say, silent, sys, TASK_PROMPT, tempDir, TraceBuilder, traceId, user, type MathTask } from "../unit/replay/fixtures.js";

let dir: string;
let cleanup: () => Promise<void>;
beforeEach(async () => ({ dir, cleanup } = await tempDir()));
afterEach(() => cleanup());

/** A rollout with `tools` complete tool runs; reward alternates so a reward filter has work to do. */
function toolTrace(n: number, tools: number): TraceRecord {
  const b = new TraceBuilder();
  let last = b.chain(null, [[sys()], [user(TASK_PROMPT)]]);
  for (let t = 0; t < tools; t++) last = b.chain(last, [[call(`c${t}`), true], [result(`c${t}`, String(40 + t))]]);
  b.add(last, say("42"), true);
  return b.trace(traceId(n), { rewards: { correct: n % 2 } });
}

describe("replay follows a run's own records while it runs", () => {
  it("a worker following step by step and a late worker agree on every task", async () => {
    const root = path.join(dir, "run", "rollouts");
    const writer = new RecordWriter(root);
    const config = {
      records: "run/rollouts/step_*/train_rollouts_*.jsonl",
      source: { id: "gsm8k" },
      mode: "continue" as const,
      anchor: "tool-call" as const,
      max_anchors: 2,
      seed: 11,
      max_source_reward: 0.5,
      wait_for_step_marker: true,
    };
    const follower = new ReplayTaskSource<MathTask, string, number>(config, mathSource(), { cwd: dir, logger: silent });
    const sizes: number[] = [];
    let n = 0;
    for (let step = 1; step <= 12; step++) {
      writer.enqueue(
        step,
        ["alpha", "beta", "gamma"].map((env) => ({
          kind: "train" as const,
          env,
          traces: [toolTrace(n++, 1 + (n % 4)), toolTrace(n++, 1 + (n % 4)), linearTrace(traceId(n++), 0)],
          policyVersion: step - 1,
        })),
      );
      if (step % 3 === 0) {
        await writer.flush();
        await follower.reload();
        sizes.push(follower.size);
      }
    }
    await writer.flush();
    await follower.reload();
    const late = new ReplayTaskSource<MathTask, string, number>(config, mathSource(), { cwd: dir, logger: silent });
    await late.load();

    expect(sizes.every((s, i) => i === 0 || s > sizes[i - 1]!)).toBe(true);
    expect(follower.size).toBeGreaterThan(0);
    expect(follower.tasks).toEqual(late.tasks);
    expect(follower.tasks.map((t) => t.idx)).toEqual(follower.tasks.map((_, i) => i));
    // Only incorrect (reward 0) sources, each giving at most max_anchors seeds that end with a tool result.
    const perTrace = new Map<string, number>();
    for (const task of follower.tasks) {
      perTrace.set(task.lineage.sourceTraceId, (perTrace.get(task.lineage.sourceTraceId) ?? 0) + 1);
      expect(Array.isArray(task.prompt) && task.prompt.at(-1)!.role).toBe("tool");
      expect(task.task.answer).toBe("42");
    }
    expect(Math.max(...perTrace.values())).toBeLessThanOrEqual(2);
    expect(follower.stats.read.filesIndexed).toBe(36);
    expect(follower.stats.read.skipped.source_reward).toBeGreaterThan(0);
    expect(follower.stats.noSeed).toBe(36); // each env-step file has one linear record: reward 0, no tool runs
  });
});
