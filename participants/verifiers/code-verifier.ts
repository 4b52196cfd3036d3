import { z } from "zod";
import { CheckpointError, JsonValueSchema, canonicalJson } from "../../protocol/index.js";
import { DEFAULT_SANDBOX_LIMITS, runSandboxed, type SandboxLimits } from "./sandbox/run-sandboxed.js";
import { submittedCode } from "./code-block.js";
import { VerifierServer, parseVerifierBody, verifierTaskSchema, type VerifyResult } from "./verifier-server.js";

export const MAX_CASES = 100;

/** Names the sandbox's call `name(...args)` cannot take: every case would fail, whatever was submitted. */
const RESERVED_WORDS = new Set(
  "break case catch class const continue debugger default delete do else enum export extends false finally for function if import in instanceof new null return super switch this throw true try typeof var void while with".split(" "),
);
const CodeVerifyBodySchema = z
  .object({
    task: verifierTaskSchema({
      function_name: z
        .string()
        .regex(/^[A-Za-z_$][A-Za-z0-9_$]{0,63}$/, "function_name must be a JavaScript identifier")
        .refine((name) => !RESERVED_WORDS.has(name), "function_name must not be a reserved word"),
      // Used as sent, an own `__proto__` key included (JsonValueSchema keeps it as data).
      tests: z.array(z.object({ args: z.array(JsonValueSchema).max(32), expected: JsonValueSchema }).strict()).min(1).max(MAX_CASES),
    }),
    answer: z.string().min(1).max(100_000),
  })
  .strict();

/**
 * Runs a submitted JavaScript function against test cases in a sandboxed child process
 * (see run-sandboxed.ts for the limits). Reward = fraction of cases whose JSON result equals
 * the expected value; 0 when the run was stopped by a limit.
 */
export class CodeVerifier extends VerifierServer {
  constructor(private readonly limits: SandboxLimits = DEFAULT_SANDBOX_LIMITS) {
    super();
  }

  /** `signal` (a retire of the request) stops the run: it rejects with the signal's `stale_attempt`. */
  async verify(body: unknown, _request?: unknown, signal?: AbortSignal): Promise<VerifyResult> {
    const { task, answer } = parseVerifierBody(CodeVerifyBodySchema, body);
    // A case returning more than the sandbox's output limit fails as output_limit, so such an expected value could never pass.
    const tooLong = task.tests.findIndex((test) => JSON.stringify(test.expected).length > this.limits.maxCaseOutputChars);
    if (tooLong !== -1) {
      throw new CheckpointError("invalid_request", `task.tests[${tooLong}].expected is longer than ${this.limits.maxCaseOutputChars} characters as JSON`);
    }
    const submitted = submittedCode(answer);
    if ("language" in submitted) return { reward: 0, status: "unsupported_language", language: submitted.language, passed: 0, total: task.tests.length };
    const outcome = await runSandboxed(
      { mode: "function", code: submitted.code, function_name: task.function_name, cases: task.tests.map((t) => ({ args: t.args })) },
      this.limits,
      signal,
    );
    if (outcome.status !== "completed") return { reward: 0, status: outcome.status, passed: 0, total: task.tests.length };
    let passed = 0;
    const statuses = outcome.results.map((result, index) => {
      if (result.status !== "ok") return result.status;
      try {
        const ok = canonicalJson(JSON.parse(result.output)) === canonicalJson(task.tests[index]!.expected);
        if (ok) passed += 1;
        return ok ? "pass" : "fail";
      } catch {
        return "fail";
      }
    });
    return { reward: passed / task.tests.length, status: "completed", passed, total: task.tests.length, cases: statuses };
  }
}
