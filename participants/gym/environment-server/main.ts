import { isUnreadableStorage, toCheckpointError } from "../../../protocol/index.js";
import { EnvironmentKind } from "../../kinds/environment/index.js";
import { ReplayError } from "../../replay/errors.js";
import { loadGymReplaySource, readGymReplayConfig, type GymReplayConfig } from "../../replay/gym-replay-source.js";
import { episodeTimeoutFlag, startServerRuntime, urlFlagsRefusal } from "../server-runtime.js";
import { createEnvironmentApp } from "./environment-server.js";

/**
 * The reference environment server process.
 *   --agent-url <url>       the agent server base URL
 *   --resources-url <url>   the resources server base URL
 *   --episode-timeout-ms    per-episode deadline (checkpoint pauses do not count)
 *   --replay-config <file>  serve a replay task source (docs/replay.md) at /replay/next
 */
let replayConfig: GymReplayConfig | undefined;

/**
 * --replay-config is read and checked with the other flags, before NATS: with NATS down a bad one
 * is still invalid_request, exit 2, not `unreachable`, exit 1, which a supervisor restarts for ever.
 * One the storage refuses to read (EACCES, EIO) is storage_error, exit 1, as for its records.
 * What it read is kept for the load below (its records are read after connecting).
 */
function replayConfigRefusal(file: string | undefined): string | undefined {
  if (!file) return undefined;
  try {
    replayConfig = readGymReplayConfig(file);
    return undefined;
  } catch (error) {
    if (error instanceof ReplayError) return `${error.code}: ${error.message}`;
    // A file the storage refused to read is no bad flag (exit 2, never restarted): storage_error, exit 1.
    if (!isUnreadableStorage(error)) throw error;
    process.stderr.write(`environment-server: storage_error: ${toCheckpointError(error).message}\n`);
    process.exit(1);
  }
}

const runtime = await startServerRuntime("environment-server", process.argv.slice(2), ["agent-url", "resources-url", "episode-timeout-ms", "replay-config"], (flags) =>
  urlFlagsRefusal(flags, ["agent-url", "resources-url"]) ?? replayConfigRefusal(flags["replay-config"]),
);
const { extra, logger } = runtime;
const episodeTimeoutMs = episodeTimeoutFlag(extra);
const kind = new EnvironmentKind();
let replay: Awaited<ReturnType<typeof loadGymReplaySource>> | undefined;
try {
  replay = replayConfig ? await loadGymReplaySource(replayConfig, logger) : undefined;
} catch (error) {
  // Records the source cannot use: one line with its catalog code, exit 1 (corrupt records:
  // invalid_checkpoint_state; a file call the storage refused: storage_error), exit 2 for an
  // invalid_request as before NATS. Anything else is a bug: its stack.
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
  ...(episodeTimeoutMs !== undefined && { episodeTimeoutMs }),
});
await runtime.serve(app, kind);
