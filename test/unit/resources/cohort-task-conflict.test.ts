import { describe, expect, it } from "vitest";
import { createResourcesApp } from "../../../participants/kinds/resources/index.js";
import { CohortCompareVerifier, type CohortJudge, type CohortMember } from "../../../participants/verifiers/index.js";

/**
 * docs/verifiers.md, Cohort comparison: the judge compares responses to one task (the prompt shows
 * it once). A member whose task differs from the cohort's was judged against another member's
 * task; it is now refused with 409 cohort_task_conflict, and the cohort is left as it was.
 */
describe("cohort verifier: members of one cohort share one task", () => {
  it("refuses a member with another task, changing nothing; the matching member completes the cohort", async () => {
    const judged: CohortMember[][] = [];
    const judge: CohortJudge = async (members) => {
      judged.push(members);
      return members.map((m) => (m.answer === "best" ? 1 : 0));
    };
    const verifier = new CohortCompareVerifier({ size: 2, collectionTimeoutMs: 10_000 }, judge);
    const { app } = await createResourcesApp(verifier);
    const send = (task: unknown, index: number, answer: string) =>
      app.inject({ method: "POST", url: `/ng-rollout/r${index}/verify`, payload: { task, answer, _ng_group_id: "g", _ng_rollout_index: index } });
    try {
      const first = send({ prompt: "2+2?", meta: { a: 1, b: 2 } }, 0, "best");
      await new Promise((resolve) => setImmediate(resolve));
      const other = await send({ prompt: "3+3?" }, 1, "6");
      expect(other.statusCode).toBe(409);
      expect(other.json().error.code).toBe("cohort_task_conflict");
      expect(judged).toEqual([]);
      expect(verifier.table.activeCohorts).toBe(1);
      // The same task, keys in another order, is the same task.
      expect((await send({ meta: { b: 2, a: 1 }, prompt: "2+2?" }, 1, "4")).json()).toEqual({ reward: 0 });
      expect((await first).json()).toEqual({ reward: 1 });
      expect(judged.map((members) => members.map((m) => m.answer))).toEqual([["best", "4"]]);
    } finally {
      await app.close();
    }
  });
});
