import { BearerTokenSchema } from "../../../protocol/index.js";
import { closeWithDrain, cutTokenSetting, startServerRuntime } from "../server-runtime.js";
import { REASONING_FIELDS, createPolicyBackend, type ReasoningField } from "./policy-backend.js";

/**
 * The reference policy backend process (not a participant; it connects to NATS only because every
 * reference server shares the runtime shell).
 *   --token-delay-ms N   pause between streamed chunks (keeps streams in flight)
 *   --cut-token T        bearer token of /ng-control/v1/generation-cut (env GYM_CKPT_CUT_TOKEN; default: --token)
 *   --reasoning-field F  answer as a reasoning model, its thought under F (reasoning_content | reasoning)
 */
// Checked before NATS, with the common flags (the --token fallback of --cut-token is checked there).
const runtime = await startServerRuntime("policy-backend", process.argv.slice(2), ["token-delay-ms", "cut-token", "reasoning-field"], (flags) => {
  const delay = Number(flags["token-delay-ms"] ?? "0");
  if (!Number.isFinite(delay) || delay < 0 || delay > 60_000) return "--token-delay-ms must be a number between 0 and 60000";
  const field = flags["reasoning-field"];
  if (field !== undefined && !(REASONING_FIELDS as readonly string[]).includes(field)) return `--reasoning-field must be one of ${REASONING_FIELDS.join(", ")}`;
  return cutTokenSetting(flags).refusal;
});
const { config, extra, logger } = runtime;
const tokenDelayMs = Number(extra["token-delay-ms"] ?? "0");
const reasoning = extra["reasoning-field"] as ReasoningField | undefined;
const { app } = await createPolicyBackend({ tokenDelayMs, cutToken: BearerTokenSchema.parse(cutTokenSetting(extra).token ?? config.token), ...(reasoning && { reasoning }) });
const address = await runtime.listening(app.listen({ host: "127.0.0.1", port: config.port }));
// Bounded: a response held by /admin/hold would otherwise keep the process past SIGTERM for ever.
runtime.onShutdown(() => closeWithDrain(app, logger));
logger.info({ url: address, tokenDelayMs }, "policy backend listening");
runtime.announceReady(address);
