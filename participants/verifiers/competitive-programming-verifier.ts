import { z } from "zod";
import { DEFAULT_SANDBOX_LIMITS, runSandboxed, type SandboxLimits } from "./sandbox/run-sandboxed.js";
import { MAX_CASES } from "./code-verifier.js";
import { submittedCode } from "./code-block.js";
import { VerifierServer, parseVerifierBody, verifierTaskSchema, type VerifyResult } from "./verifier-server.js";

/** An expected output longer than the sandbox lets a case print could never pass: such a task is refused. */
function cpVerifyBodySchema(maxOutputChars: number) {
  return z
    .object({
      task: verifierTaskSchema({ cases: z.array(z.object({ input: z.string().max(1_000_000), output: z.string().max(maxOutputChars) }).strict()).min(1).max(MAX_CASES) }),
      answer: z.string().min(1).max(100_000),
    })
    .strict();
}

/** Output comparison that ignores trailing spaces on lines and trailing blank lines. */
export function normalizeOutput(text: string): string {
  const joined = text
    .replace(/\r\n/g, "\n")
    .split("\n")
    .map((line) => line.trimEnd())
    .join("\n");
  // Not /\n+$/: it backtracks quadratically on a long run of newlines before other text, in this
  // process (outside the sandbox's limits), on output the submission controls.
  let end = joined.length;
  while (end > 0 && joined[end - 1] === "\n") end -= 1;
  return joined.slice(0, end);
}

/**
 * Competitive programming: the program reads the case's stdin through `input` (a string) or
 * `readLine()`, writes with `print(...)` / `console.log(...)`, and must print the expected
 * output. All cases must pass for reward 1. Same sandbox and limits as the code verifier.
 */
export class CompetitiveProgrammingVerifier extends VerifierServer {
  private readonly schema: ReturnType<typeof cpVerifyBodySchema>;

  constructor(private readonly limits: SandboxLimits = DEFAULT_SANDBOX_LIMITS) {
    super();
    this.schema = cpVerifyBodySchema(limits.maxCaseOutputChars);
  }

  async verify(body: unknown, _request?: unknown, signal?: AbortSignal): Promise<VerifyResult> {
    const { task, answer } = parseVerifierBody(this.schema, body);
    const submitted = submittedCode(answer);
    if ("language" in submitted) return { reward: 0, status: "unsupported_language", language: submitted.language, passed: 0, total: task.cases.length };
    const outcome = await runSandboxed({ mode: "stdio", code: submitted.code, cases: task.cases.map((c) => ({ input: c.input })) }, this.limits, signal);
    if (outcome.status !== "completed") return { reward: 0, status: outcome.status, passed: 0, total: task.cases.length };
    let passed = 0;
    const verdicts = outcome.results.map((result, index) => {
      if (result.status !== "ok") return result.status;
      const ok = normalizeOutput(result.output) === normalizeOutput(task.cases[index]!.output);
      if (ok) passed += 1;
      return ok ? "pass" : "wrong_answer";
    });
    return { reward: passed === task.cases.length ? 1 : 0, status: "completed", passed, total: task.cases.length, cases: verdicts };
  }
}
