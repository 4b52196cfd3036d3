import { describe, expect, it } from "vitest";
import { modelCohortJudge, type CohortMember, type JudgeClient } from "../../../participants/verifiers/index.js";

/** A judge that answers `reply` whatever it is asked (a unit-test stand-in for JudgeClient). */
function judgeAnswering(reply: string): JudgeClient {
  return { ask: async () => reply } as unknown as JudgeClient;
}

const members: CohortMember[] = [0, 1, 2].map((index) => ({ index, answer: `answer ${index}`, task: { q: "t" } }));
const judged = (reply: string) => modelCohortJudge(judgeAnswering(reply))(members, new AbortController().signal);

/** docs/verifiers.md: the judge names one member with `BEST: <index>`; any other reply is judge_failed. */
describe("cohort judge: the reply names one best member", () => {
  it("rewards the member a reply names, after any reasoning, and names again", async () => {
    expect(await judged("BEST: 1")).toEqual([0, 1, 0]);
    expect(await judged("Response 2 is complete and correct.\nbest: 2")).toEqual([0, 0, 1]);
    expect(await judged("BEST: 0\n\nSo, BEST: 0")).toEqual([1, 0, 0]);
  });

  it("reads the reply after a reasoning judge's think block, whose weighing may name other members", async () => {
    expect(await judged("<think>Is it BEST: 0? No: 0 has an error, 2 is complete.</think>\n\nBEST: 2")).toEqual([0, 0, 1]);
    expect(await judged("BEST: 1 looks tempting, but 0 is right.</think>BEST: 0")).toEqual([1, 0, 0]);
    await expect(judged("<think>BEST: 1</think> I cannot decide")).rejects.toThrow();
  });

  it("fails a reply naming two different members, instead of rewarding the first one named", async () => {
    await expect(judged("BEST: 0. On reflection 0 has an error; BEST: 2")).rejects.toThrow();
    await expect(judged("BEST: 1 or BEST: 2")).rejects.toThrow();
    await expect(judged("no verdict")).rejects.toThrow();
  });
});
