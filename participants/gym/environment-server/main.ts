import { startParticipant } from "../../control-plane/start-participant.js";
import { EnvironmentKind } from "../../kinds/environment/index.js";
import { startServerRuntime } from "../server-runtime.js";
import { createEnvironmentApp } from "./environment-server.js";

/**
 * The reference environment server process.
 *   --agent-url <url>       the agent server base URL
 *   --resources-url <url>   the resources server base URL
 *   --episode-timeout-ms    per-episode deadline (checkpoint pauses do not count)
 */
const runtime = await startServerRuntime("environment-server", process.argv.slice(2), ["agent-url", "resources-url", "episode-timeout-ms"]);
const { config, extra, logger } = runtime;
if (!extra["agent-url"] || !extra["resources-url"]) {
  process.stderr.write("environment-server: --agent-url and --resources-url are required\n");
  process.exit(2);
}
const kind = new EnvironmentKind();
const app = createEnvironmentApp({
  kind,
  endpoints: { agentUrl: extra["agent-url"], resourcesUrl: extra["resources-url"] },
  ...(extra["episode-timeout-ms"] && { episodeTimeoutMs: Number(extra["episode-timeout-ms"]) }),
});
const address = await app.listen({ host: "127.0.0.1", port: config.port });
const participant = await startParticipant({
  nc: runtime.nc,
  deployment: config.deployment,
  instance: config.instance,
  token: config.token,
  adapter: kind,
  logger,
  ...(config.checkpointRoot && { checkpointRoot: config.checkpointRoot }),
  ...(config.leaseGraceSeconds !== undefined && { leaseGraceSeconds: config.leaseGraceSeconds }),
});
runtime.onShutdown(async () => {
  await participant.stop();
  await app.close();
});
runtime.announceReady(address);
