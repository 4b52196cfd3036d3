import { describe, expect, it } from "vitest";
import { CheckpointError } from "../../../protocol/index.js";
import { CodeVerifier, MathVerifier } from "../../../participants/verifiers/index.js";

/**
 * A task is JSON (docs/verifiers.md). Over HTTP it cannot hold `undefined`, NaN or a function; a
 * direct verify() call can, and such a value — an expected `[undefined]` among them — is refused
 * with invalid_request, never read as the `[null]` JSON.stringify would write for it (a function's
 * `[undefined]` result is an `error` case, not `[null]`: code-result-json-faithful.test.ts). The
 * detail names the field and what a JSON value excludes; it said only "Invalid input", and then
 * spoke of nesting depth for a value nested one level deep.
 */
describe("verifier tasks holding values JSON cannot", () => {
  it("are refused with invalid_request naming the field and what is not JSON, before anything runs", async () => {
    const code = new CodeVerifier();
    for (const expected of [[undefined], { a: undefined }, [Number.NaN], Number.POSITIVE_INFINITY]) {
      const refusal = await code.verify({ task: { function_name: "f", tests: [{ args: [], expected }] }, answer: "function f() { return [null]; }" }).catch((error: unknown) => error);
      expect(refusal, String(expected)).toBeInstanceOf(CheckpointError);
      expect(refusal).toMatchObject({ code: "invalid_request", message: expect.stringMatching(/^task\.tests\.0\.expected: .*no undefined, NaN, Infinity/) });
    }
    const math = await new MathVerifier().verify({ task: { expected_answer: "1", source: [undefined] }, answer: "1" }).catch((error: unknown) => error);
    expect(math).toMatchObject({ code: "invalid_request", message: expect.stringMatching(/^task\.source: .*no undefined/) });
  });
});
