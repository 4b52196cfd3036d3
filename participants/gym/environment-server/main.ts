import { EnvironmentKind } from "../../kinds/environment/index.js";
import { loadGymReplaySource } from "../../replay/gym-replay-source.js";
import { startServerRuntime } from "../server-runtime.js";
import { createEnvironmentApp } from "./environment-server.js";

/**
 * The reference environment server process.
 *   --agent-url <url>       the agent server base URL
 *   --resources-url <url>   the resources server base URL
 *   --episode-timeout-ms    per-episode deadline (checkpoint pauses do not count)
 *   --replay-config <file>  serve a replay task source (docs/replay.md) at /replay/next
 */
const runtime = await startServerRuntime("environment-server", process.argv.slice(2), ["agent-url", "resources-url", "episode-timeout-ms", "replay-config"]);
const { extra, logger } = runtime;
if (!extra["agent-url"] || !extra["resources-url"]) {
  process.stderr.write("environment-server: --agent-url and --resources-url are required\n");
  process.exit(2);
}
const kind = new EnvironmentKind();
const replay = extra["replay-config"] ? await loadGymReplaySource(extra["replay-config"], logger) : undefined;
const app = createEnvironmentApp({
  ...(replay && { replay }),
  kind,
  endpoints: { agentUrl: extra["agent-url"], resourcesUrl: extra["resources-url"] },
  ...(extra["episode-timeout-ms"] && { episodeTimeoutMs: Number(extra["episode-timeout-ms"]) }),
});
await runtime.serve(app, kind);
