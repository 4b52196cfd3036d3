import { describe, expect, it } from "vitest";
import { CheckpointError } from "../../../protocol/index.js";
import { MathVerifier } from "../../../participants/verifiers/index.js";

/**
 * A math task whose expected answer is empty once normalized (a data set's missing answer sent
 * as "", or only `$`, spacing, a `\boxed{}`) rewarded every empty answer with 1 and every real one
 * with 0: a policy trained on it learns to answer nothing. Such a task is refused.
 */
describe("math verifier: an expected answer that normalizes to nothing", () => {
  it("is refused with invalid_request, whatever the answer", async () => {
    for (const expected_answer of ["", "  ", "$$", "\\boxed{}", " . "]) {
      for (const answer of ["", "\\boxed{}", "42"]) {
        const refusal = await new MathVerifier().verify({ task: { expected_answer }, answer }).catch((error: unknown) => error);
        expect(refusal, JSON.stringify({ expected_answer, answer })).toBeInstanceOf(CheckpointError);
        expect((refusal as CheckpointError).code).toBe("invalid_request");
      }
    }
  });

  it("an empty answer still scores 0 against a real one", async () => {
    expect(await new MathVerifier().verify({ task: { expected_answer: "42" }, answer: "\\boxed{}" })).toEqual({ reward: 0, extracted: "" });
  });
});
