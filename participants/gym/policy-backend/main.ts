import { BearerTokenSchema } from "../../../protocol/index.js";
import { closeWithDrain, startServerRuntime } from "../server-runtime.js";
import { createPolicyBackend } from "./policy-backend.js";

/**
 * The reference policy backend process (not a participant; it connects to NATS only because every
 * reference server shares the runtime shell).
 *   --token-delay-ms N   pause between streamed chunks (keeps streams in flight)
 *   --cut-token T        bearer token of /ng-control/v1/generation-cut (default: --token)
 */
const runtime = await startServerRuntime("policy-backend", process.argv.slice(2), ["token-delay-ms", "cut-token"]);
const { config, extra, logger } = runtime;
const tokenDelayMs = Number(extra["token-delay-ms"] ?? "0");
if (!Number.isFinite(tokenDelayMs) || tokenDelayMs < 0 || tokenDelayMs > 60_000) {
  process.stderr.write("policy-backend: --token-delay-ms must be a number between 0 and 60000\n");
  process.exit(2);
}
const cutToken = BearerTokenSchema.safeParse(extra["cut-token"] ?? config.token);
if (!cutToken.success) {
  process.stderr.write(`policy-backend: --cut-token: ${cutToken.error.issues[0]!.message}\n`);
  process.exit(2);
}
const { app } = await createPolicyBackend({ tokenDelayMs, cutToken: cutToken.data });
const address = await runtime.listening(app.listen({ host: "127.0.0.1", port: config.port }));
// Bounded: a response held by /admin/hold would otherwise keep the process past SIGTERM for ever.
runtime.onShutdown(() => closeWithDrain(app, logger));
logger.info({ url: address, tokenDelayMs }, "policy backend listening");
runtime.announceReady(address);
