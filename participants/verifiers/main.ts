import { createResourcesApp } from "../kinds/resources/index.js";
import { startServerRuntime } from "../gym/server-runtime.js";
import { CodeVerifier } from "./code-verifier.js";
import { CohortCompareVerifier, modelCohortJudge } from "./cohort-compare-verifier.js";
import { CompetitiveProgrammingVerifier } from "./competitive-programming-verifier.js";
import { EquivalenceJudgeVerifier } from "./equivalence-judge-verifier.js";
import { JudgeClient } from "./judge-client.js";
import { MathVerifier } from "./math-verifier.js";
import { stopSandboxes } from "./sandbox/run-sandboxed.js";
import { SANDBOX_SLOTS } from "./sandbox/sandbox-slots.js";
import type { VerifierServer } from "./verifier-server.js";

/**
 * A verifier process: `node dist/participants/verifiers/main.js --verifier <name> [...]`
 *   --verifier math | code | competitive | equivalence | cohort
 *   --judge-url <OpenAI-compatible base URL> (equivalence, cohort), --judge-model, --judge-timeout-ms
 *   (the judge's API key, if it needs one, from GYM_CKPT_JUDGE_API_KEY: never on a command line)
 *   --cohort-size <n>, --collection-timeout-ms, --evaluation-timeout-ms, --max-active-cohorts (cohort)
 *   --max-sandbox-queue <n> (code, competitive: runs that may wait for a sandbox slot)
 */
const runtime = await startServerRuntime("verifier", process.argv.slice(2), [
  "verifier",
  "judge-url",
  "judge-model",
  "judge-timeout-ms",
  "cohort-size",
  "collection-timeout-ms",
  "evaluation-timeout-ms",
  "max-active-cohorts",
  "max-sandbox-queue",
]);
const { extra, logger } = runtime;

function judge(): JudgeClient {
  if (!extra["judge-url"]) throw new Error("--judge-url is required for judge-based verifiers");
  const apiKey = process.env.GYM_CKPT_JUDGE_API_KEY;
  return new JudgeClient({
    baseUrl: extra["judge-url"],
    ...(extra["judge-model"] && { model: extra["judge-model"] }),
    ...(extra["judge-timeout-ms"] !== undefined && { requestTimeoutMs: Number(extra["judge-timeout-ms"]) }),
    ...(apiKey && { apiKey }),
  });
}

function build(): VerifierServer {
  switch (extra.verifier ?? "math") {
    case "math":
      return new MathVerifier();
    case "code":
      return new CodeVerifier();
    case "competitive":
      return new CompetitiveProgrammingVerifier();
    case "equivalence":
      return new EquivalenceJudgeVerifier(judge());
    case "cohort":
      return new CohortCompareVerifier(
        {
          size: Number(extra["cohort-size"] ?? "2"),
          ...(extra["collection-timeout-ms"] && { collectionTimeoutMs: Number(extra["collection-timeout-ms"]) }),
          ...(extra["evaluation-timeout-ms"] && { evaluationTimeoutMs: Number(extra["evaluation-timeout-ms"]) }),
          ...(extra["max-active-cohorts"] && { maxActiveCohorts: Number(extra["max-active-cohorts"]) }),
        },
        modelCohortJudge(judge()),
      );
    default:
      throw new Error(`unknown --verifier ${extra.verifier}`);
  }
}

let server: VerifierServer;
try {
  if (extra["max-sandbox-queue"] !== undefined) {
    const queue = Number(extra["max-sandbox-queue"]);
    if (!Number.isInteger(queue) || queue < 0) throw new Error("--max-sandbox-queue must be an integer ≥ 0");
    SANDBOX_SLOTS.maxQueued = queue;
  }
  server = build();
} catch (error) {
  process.stderr.write(`verifier: ${error instanceof Error ? error.message : String(error)}\n`);
  process.exit(2);
}
// Registered before serve(), so it runs after the HTTP drain: sandbox children of verifies still
// running then are killed instead of outliving this process.
runtime.onShutdown(stopSandboxes);
const { app, kind } = await createResourcesApp(server, { logger });
app.get("/health", async () => ({
  ok: true,
  verifier: extra.verifier ?? "math",
  mode: kind.mode,
  verify: kind.verify,
  ...(server instanceof CohortCompareVerifier && { active_cohorts: server.table.activeCohorts }),
}));
await runtime.serve(app, kind);
