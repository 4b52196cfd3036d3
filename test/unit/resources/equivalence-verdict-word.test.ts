import { describe, expect, it } from "vitest";
import { EquivalenceJudgeVerifier, type JudgeClient } from "../../../participants/verifiers/index.js";

/** A judge that answers `reply` whatever it is asked (a unit-test stand-in for JudgeClient). */
function judgeAnswering(reply: string): JudgeClient {
  return { ask: async () => reply } as unknown as JudgeClient;
}

const verdictOf = (reply: string) =>
  new EquivalenceJudgeVerifier(judgeAnswering(reply)).verify({ task: { expected_answer: "x + 1" }, answer: "x+1" });

/** docs/verifiers.md: a reply that is neither YES nor NO is judge_failed (masked), not a verdict. */
describe("equivalence judge: the verdict is the word YES or NO, not a prefix", () => {
  it("reads YES and NO as a whole first word, with punctuation or an explanation after it", async () => {
    for (const reply of ["YES", "yes", " Yes.\n", "YES, they are equal", "yes\nbecause"]) expect(await verdictOf(reply), reply).toEqual({ reward: 1, verdict: "YES" });
    for (const reply of ["NO", "no", "No.", "NO: the signs differ"]) expect(await verdictOf(reply), reply).toEqual({ reward: 0, verdict: "NO" });
  });

  it("masks a reply whose first word only starts with YES or NO, instead of scoring it", async () => {
    for (const reply of ["Not sure", "Nonetheless, YES", "Nope", "None of them", "Yesterday's answer was wrong: NO"]) {
      expect(await verdictOf(reply), reply).toMatchObject({ reward: 0, _ng_failure_class: "judge_failed" });
    }
  });

  it("reads the verdict through markdown emphasis, quotes and a leading think block (a reasoning judge's)", async () => {
    for (const reply of ["**YES**", "*Yes*.", "__yes__", "`YES`", "\"YES\"", "<think>The two are equal.</think>\n\n**YES**", "<think>\nhmm, no doubt\n</think>YES", "the signs agree, not a NO</think>\nYES"]) {
      expect(await verdictOf(reply), reply).toEqual({ reward: 1, verdict: "YES" });
    }
    for (const reply of ["**NO**", "<think>Yes? Wait.</think> NO."]) expect(await verdictOf(reply), reply).toEqual({ reward: 0, verdict: "NO" });
    // Still the whole first word, after the wrappers; an unclosed think block gives no verdict.
    for (const reply of ["**Nonetheless**, YES", "**Answer:** YES", "<think>YES", "<think>a</think> Nonetheless, YES", "** Not sure", "YES_NO", "no_answer"]) {
      expect(await verdictOf(reply), reply).toMatchObject({ reward: 0, _ng_failure_class: "judge_failed" });
    }
  });

  it("reads a long reply in linear time (the judge's reply may be 8 MiB: leading spacing before text made the think-block pattern backtrack)", { timeout: 60_000 }, async () => {
    const started = performance.now();
    for (const reply of [" ".repeat(200_000) + "x".repeat(200_000), "<think>" + " \n".repeat(200_000), "*".repeat(400_000) + "x"]) {
      expect(await verdictOf(reply)).toMatchObject({ _ng_failure_class: "judge_failed" });
    }
    expect(await verdictOf(" ".repeat(200_000) + "<think>" + "x".repeat(200_000) + "</think> YES")).toEqual({ reward: 1, verdict: "YES" });
    expect(performance.now() - started).toBeLessThan(2_000);
  });
});
