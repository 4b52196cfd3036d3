import { describe, expect, it } from "vitest";
import { CodeVerifier } from "../../../participants/verifiers/index.js";
import { CODE_LIMITS, verifyOnce } from "./verify-once.js";

/**
 * docs/verifiers.md: the code verifier compares a case's result with `expected` as canonical JSON.
 * JSON has no NaN or Infinity, and JSON.stringify writes them as `null`, so a function answering
 * 0/0 passed a case expecting `null` (and `[NaN]` one expecting `[null]`). A result holding a
 * non-finite number is now a case `error`, like a result JSON cannot encode at all.
 */

async function verify(payload: object) {
  return (await verifyOnce(new CodeVerifier(CODE_LIMITS), payload)).body;
}

describe("code verifier: NaN and Infinity in a result", () => {
  it("never equal null", async () => {
    const tests = [
      { args: [0], expected: null },
      { args: [1], expected: null },
      { args: [2], expected: [null] },
      { args: [3], expected: { a: null } },
      { args: [4], expected: null },
    ];
    const answer = "function f(i) { return [0 / 0, 1 / 0, [NaN], { a: -Infinity }, null][i]; }";
    expect(await verify({ task: { function_name: "f", tests }, answer })).toEqual({
      reward: 0.2,
      status: "completed",
      passed: 1,
      total: 5,
      cases: ["error", "error", "error", "error", "pass"],
    });
  });

  it("leave finite results, -0 and toJSON as they were", async () => {
    const tests = [
      { args: [0], expected: 0 },
      { args: [1], expected: 1.5 },
      { args: [2], expected: "x" },
      { args: [3], expected: [1, null] },
    ];
    // [1, undefined] is no longer [1, null]: code-result-json-faithful.test.ts.
    const answer = "function f(i) { return [-0, 1.5, { toJSON() { return 'x'; } }, [1, null]][i]; }";
    expect(await verify({ task: { function_name: "f", tests }, answer })).toMatchObject({ reward: 1, passed: 4 });
  });
});
