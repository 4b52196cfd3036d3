import { describe, expect, it } from "vitest";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { CohortCompareVerifier, type CohortJudge, type CohortMember } from "../../../participants/verifiers/index.js";

/**
 * A task's own `__proto__` key (JSON.parse makes it an ordinary key) is data like any other: zod's
 * `z.json()` and `z.object().catchall()` build their output by assignment, which set the copy's
 * prototype instead and dropped the key. The cohort judge was then shown the task without it, and
 * two members whose tasks differed only there were judged as one cohort of one task.
 */
describe("verifier tasks keep an own __proto__ key as data", () => {
  const cohort = async (tasks: string[]) => {
    const judged: CohortMember[][] = [];
    const judge: CohortJudge = async (members) => (judged.push(members), members.map(() => 1));
    const { app } = await createResourcesApp(new CohortCompareVerifier({ size: tasks.length, collectionTimeoutMs: 10_000 }, judge));
    try {
      // The payload as bytes: an object literal's `"__proto__": …` would set the prototype instead.
      const send = (task: string, index: number) =>
        app.inject({ method: "POST", url: `/ng-rollout/r${index}/verify`, payload: `{"task": ${task}, "answer": "a${index}", "_ng_group_id": "g", "_ng_rollout_index": ${index}}`, headers: { "content-type": "application/json" } });
      const first = send(tasks[0]!, 0);
      await new Promise((resolve) => setImmediate(resolve));
      const rest = await Promise.all(tasks.slice(1).map((task, i) => send(task, i + 1)));
      if (judged.length === 0) return { judged, replies: rest.map((reply) => reply.json()) };
      return { judged, replies: [(await first).json(), ...rest.map((reply) => reply.json())] };
    } finally {
      await app.close();
    }
  };

  it("shows the cohort judge the task with its __proto__ key, nested ones too", async () => {
    const task = '{"q": "pick", "__proto__": {"hint": 1}, "meta": {"__proto__": [2]}}';
    const { judged, replies } = await cohort([task, task]);
    expect(replies).toEqual([{ reward: 1 }, { reward: 1 }]);
    const shown = judged[0]![0]!.task as Record<string, unknown>;
    expect(JSON.stringify(shown)).toBe('{"q":"pick","__proto__":{"hint":1},"meta":{"__proto__":[2]}}');
    expect(Object.getPrototypeOf(shown)).toBe(Object.prototype);
  });

  it("refuses a member whose task differs from the cohort's only in a __proto__ key (cohort_task_conflict)", async () => {
    const { judged, replies } = await cohort(['{"q": "pick", "__proto__": {"hint": 1}}', '{"q": "pick", "__proto__": {"hint": 2}}']);
    expect(judged).toEqual([]);
    expect(replies.map((reply) => reply.error?.code)).toEqual(["cohort_task_conflict"]);
  });
});
