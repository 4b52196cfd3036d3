import { createResourcesApp } from "../kinds/resources/index.js";
import { isHttpUrl } from "../../protocol/index.js";
import { startServerRuntime, urlHasCredentials } from "../gym/server-runtime.js";
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
 *   --replayable-end-hold-ms <ms> how long a session a (replayable) /verify ended stays held for a
 *     checkpoint that may be under way (default 60000, the coordinator's default op deadline)
 *   --unused-seed-lifetime-ms <ms> how long a seeded session no request names lives (its seed reply
 *     may have been lost; default 3600000, 0: for ever)
 */
const VERIFIERS = ["math", "code", "competitive", "equivalence", "cohort"];

/** Built by flagRefusal, before NATS. */
let server!: VerifierServer;

/** Checked before NATS, with the common flags: with NATS down a bad flag must still exit 2, not be restarted as unreachable. */
function flagRefusal(flags: Record<string, string | undefined>): string | undefined {
  const verifier = flags.verifier ?? "math";
  if (!VERIFIERS.includes(verifier)) return `unknown --verifier ${verifier} (${VERIFIERS.join(", ")})`;
  if ((verifier === "equivalence" || verifier === "cohort") && !flags["judge-url"]) return "--judge-url is required for judge-based verifiers";
  if (flags["judge-url"] !== undefined && !isHttpUrl(flags["judge-url"])) return "--judge-url must be an http or https URL";
  // fetch refuses such a URL and quotes it, password included, in every judge_failed detail. Not echoed.
  if (flags["judge-url"] !== undefined && urlHasCredentials(flags["judge-url"])) return "--judge-url may not carry credentials (user:password@): a judge's API key goes in GYM_CKPT_JUDGE_API_KEY";
  for (const [flag, least] of [["cohort-size", 1], ["max-active-cohorts", 1], ["max-sandbox-queue", 0]] as const) {
    const value = flags[flag];
    if (value !== undefined && !(/^\d+$/.test(value) && Number(value) >= least)) return `--${flag} must be an integer ≥ ${least}`;
  }
  // The constructors check the rest (a judge timeout of 0, a cohort timeout of 0): built here, before NATS, for the same reason.
  try {
    server = build(flags);
  } catch (error) {
    return error instanceof Error ? error.message : String(error);
  }
  return undefined;
}

const runtime = await startServerRuntime(
  "verifier",
  process.argv.slice(2),
  ["verifier", "judge-url", "judge-model", "judge-timeout-ms", "cohort-size", "collection-timeout-ms", "evaluation-timeout-ms", "max-active-cohorts", "max-sandbox-queue", "replayable-end-hold-ms", "unused-seed-lifetime-ms"],
  flagRefusal,
);
const { extra, logger } = runtime;

function judge(flags: Record<string, string | undefined>): JudgeClient {
  const apiKey = process.env.GYM_CKPT_JUDGE_API_KEY;
  return new JudgeClient({
    baseUrl: flags["judge-url"]!, // required for these verifiers, before NATS
    ...(flags["judge-model"] && { model: flags["judge-model"] }),
    ...(flags["judge-timeout-ms"] !== undefined && { requestTimeoutMs: Number(flags["judge-timeout-ms"]) }),
    ...(apiKey && { apiKey }),
  });
}

function build(flags: Record<string, string | undefined>): VerifierServer {
  switch (flags.verifier ?? "math") {
    case "math":
      return new MathVerifier();
    case "code":
      return new CodeVerifier();
    case "competitive":
      return new CompetitiveProgrammingVerifier();
    case "equivalence":
      return new EquivalenceJudgeVerifier(judge(flags));
    case "cohort":
      return new CohortCompareVerifier(
        {
          size: Number(flags["cohort-size"] ?? "2"),
          ...(flags["collection-timeout-ms"] && { collectionTimeoutMs: Number(flags["collection-timeout-ms"]) }),
          ...(flags["evaluation-timeout-ms"] && { evaluationTimeoutMs: Number(flags["evaluation-timeout-ms"]) }),
          ...(flags["max-active-cohorts"] && { maxActiveCohorts: Number(flags["max-active-cohorts"]) }),
        },
        modelCohortJudge(judge(flags)),
      );
    default:
      throw new Error(`unknown --verifier ${flags.verifier}`);
  }
}

if (extra["max-sandbox-queue"] !== undefined) SANDBOX_SLOTS.maxQueued = Number(extra["max-sandbox-queue"]);
// Registered before serve(), so it runs after the HTTP drain: sandbox children of verifies still
// running then are killed instead of outliving this process.
runtime.onShutdown(stopSandboxes);
const hold = extra["replayable-end-hold-ms"];
const lifetime = extra["unused-seed-lifetime-ms"];
const { app, kind } = await createResourcesApp(server, {
  logger,
  ...(hold !== undefined && { replayableEndHoldMs: Number(hold) }),
  ...(lifetime !== undefined && { unusedSeedLifetimeMs: Number(lifetime) }),
});
app.get("/health", async () => ({
  ok: true,
  verifier: extra.verifier ?? "math",
  mode: kind.mode,
  verify: kind.verify,
  ...(server instanceof CohortCompareVerifier && { active_cohorts: server.table.activeCohorts }),
}));
await runtime.serve(app, kind);
