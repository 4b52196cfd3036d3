import { isUnreadableStorage, toCheckpointError } from "../../../protocol/index.js";
import { EnvironmentKind } from "../../kinds/environment/index.js";
import { ReplayError } from "../../replay/errors.js";
import { loadGymReplaySource } from "../../replay/gym-replay-source.js";
import { startServerRuntime, urlFlagsRefusal } from "../server-runtime.js";
import { createEnvironmentApp } from "./environment-server.js";

/**
 * The reference environment server process.
 *   --agent-url <url>       the agent server base URL
 *   --resources-url <url>   the resources server base URL
 *   --episode-timeout-ms    per-episode deadline (checkpoint pauses do not count)
 *   --replay-config <file>  serve a replay task source (docs/replay.md) at /replay/next
 */
const runtime = await startServerRuntime("environment-server", process.argv.slice(2), ["agent-url", "resources-url", "episode-timeout-ms", "replay-config"], (flags) =>
  urlFlagsRefusal(flags, ["agent-url", "resources-url"]),
);
const { extra, logger } = runtime;
const kind = new EnvironmentKind();
let replay: Awaited<ReturnType<typeof loadGymReplaySource>> | undefined;
try {
  replay = extra["replay-config"] ? await loadGymReplaySource(extra["replay-config"], logger) : undefined;
} catch (error) {
  // A bad --replay-config is a bad flag: one line with its catalog code, exit 2 (corrupt records: 1,
  // and a file call the storage refused, storage_error: 1). Anything else is a bug: its stack.
  if (!(error instanceof ReplayError) && !isUnreadableStorage(error)) throw error;
  const { code, message } = error instanceof ReplayError ? error : toCheckpointError(error);
  process.stderr.write(`environment-server: ${code}: ${message}\n`);
  process.exit(code === "invalid_request" ? 2 : 1);
}
const app = createEnvironmentApp({
  ...(replay && { replay }),
  logger,
  kind,
  endpoints: { agentUrl: extra["agent-url"]!, resourcesUrl: extra["resources-url"]! },
  ...(extra["episode-timeout-ms"] && { episodeTimeoutMs: Number(extra["episode-timeout-ms"]) }),
});
await runtime.serve(app, kind);
