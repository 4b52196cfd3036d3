import { describe, expect, it } from "vitest";
import { CodeVerifier } from "../../../participants/verifiers/index.js";
import { CODE_LIMITS, verifyOnce } from "./verify-once.js";

/**
 * The code verifier calls `function_name(...args)` in the submission's context. A task naming one
 * of the sandbox's own globals ("implement parseInt", "eval", "escape") was passed by a submission
 * that defined nothing: the call reached the built-in. A call of a name the submission left as the
 * sandbox made it is now a case `error`.
 */

async function verify(function_name: string, tests: { args: unknown[]; expected: unknown }[], answer: string) {
  return (await verifyOnce(new CodeVerifier(CODE_LIMITS), { task: { function_name, tests }, answer })).body;
}

describe("code verifier: a function_name the sandbox itself defines", () => {
  it("is no pass for a submission that does not define it", async () => {
    const parse = [{ args: ["42"], expected: 42 }];
    expect(await verify("parseInt", parse, "// nothing here")).toMatchObject({ reward: 0, cases: ["error"] });
    expect(await verify("eval", [{ args: ["1 + 2"], expected: 3 }], "const unrelated = 1;")).toMatchObject({ reward: 0, cases: ["error"] });
    expect(await verify("print", [{ args: ["x"], expected: null }], "// nothing")).toMatchObject({ reward: 0, cases: ["error"] });
  });

  it("is called when the submission defines or assigns it", async () => {
    const parse = [{ args: ["42"], expected: 42 }];
    expect(await verify("parseInt", parse, "function parseInt(s) { let n = 0; for (const c of s) n = n * 10 + (c.charCodeAt(0) - 48); return n; }")).toMatchObject({ reward: 1 });
    expect(await verify("eval", [{ args: ["1 + 2"], expected: 3 }], "eval = (expression) => expression.split('+').reduce((a, b) => a + Number(b), 0);")).toMatchObject({ reward: 1 });
    expect(await verify("parseInt", parse, "function parseInt(s) { return 7; }")).toMatchObject({ reward: 0, cases: ["fail"] });
  });
});
