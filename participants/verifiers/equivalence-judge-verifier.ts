import { z } from "zod";
import { afterThinkBlock, type JudgeClient } from "./judge-client.js";
import { VerifierServer, parseVerifierBody, verifierTaskSchema, type VerifyResult } from "./verifier-server.js";

const EquivalenceBodySchema = z
  .object({
    task: verifierTaskSchema({ expected_answer: z.string().max(100_000), question: z.string().max(100_000).optional() }),
    answer: z.string().max(100_000),
  })
  .strict();

export const EQUIVALENCE_SYSTEM_PROMPT =
  "You judge whether a candidate answer is equivalent to a reference answer. Reply with exactly one word: YES or NO.";

/**
 * The reply's first word if it is YES or NO, whole: a prefix test read "Nonetheless, YES" as NO and
 * "Yesterday…" as YES. Before it, a reasoning judge's leading think block (`<think>…</think>`, or
 * only its closing tag when the chat template opened it) and the wrappers of markdown emphasis,
 * code and quotes (`**YES**`, `"NO"`) are skipped; nothing else is.
 */
export function verdictWord(reply: string): "YES" | "NO" | undefined {
  const answer = afterThinkBlock(reply).replace(/^[\s*_`"']+/, "");
  return /^(YES|NO)(?!_*[\p{L}\p{N}])/iu.exec(answer)?.[1]?.toUpperCase() as "YES" | "NO" | undefined;
}

/**
 * Asks a judge model whether the answer is equivalent to the expected one. Pure with respect to
 * its input (temperature 0), so replaying it after a crash is safe. A judge failure is answered
 * 200 with reward 0 and `_ng_failure_class: "judge_failed"`, so the caller can mask the sample.
 */
export class EquivalenceJudgeVerifier extends VerifierServer {
  constructor(private readonly judge: JudgeClient) {
    super();
  }

  async verify(body: unknown, _request?: unknown, signal?: AbortSignal): Promise<VerifyResult> {
    const { task, answer } = parseVerifierBody(EquivalenceBodySchema, body);
    const question = task.question ? `Question: ${task.question}\n` : "";
    try {
      const verdict = await this.judge.ask(
        [
          { role: "system", content: EQUIVALENCE_SYSTEM_PROMPT },
          { role: "user", content: `${question}Reference answer: ${task.expected_answer}\nCandidate answer: ${answer}` },
        ],
        signal,
      );
      const word = verdictWord(verdict);
      if (word === "YES") return { reward: 1, verdict: "YES" };
      if (word === "NO") return { reward: 0, verdict: "NO" };
      return { reward: 0, _ng_failure_class: "judge_failed", detail: "the judge answered neither YES nor NO" };
    } catch (error) {
      // A retired request is not a judge failure: it answers the retire's stale_attempt.
      signal?.throwIfAborted();
      return { reward: 0, _ng_failure_class: "judge_failed", detail: error instanceof Error ? error.message : String(error) };
    }
  }
}
