import { AgentKind } from "../../kinds/agent/index.js";
import { episodeTimeoutFlag, startServerRuntime, urlFlagsRefusal } from "../server-runtime.js";
import { AgentSessionState } from "./agent-session-state.js";
import { createAgentApp } from "./agent-server.js";

/**
 * The reference agent server process.
 *   --policy-url <url>     the model participant (attach proxy) base URL
 *   --resources-url <url>  the resources server base URL
 *   --stream true|false    stream policy responses (default true)
 *   --episode-timeout-ms   legacy /run deadline (checkpoint pauses do not count)
 */
const runtime = await startServerRuntime("agent-server", process.argv.slice(2), ["policy-url", "resources-url", "stream", "episode-timeout-ms"], (flags) => {
  const urls = urlFlagsRefusal(flags, ["policy-url", "resources-url"]);
  if (urls) return urls;
  if (flags.stream !== undefined && flags.stream !== "true" && flags.stream !== "false") return "--stream must be true or false";
  return undefined;
});
const { extra, logger } = runtime;
const episodeTimeoutMs = episodeTimeoutFlag(extra);
const state = new AgentSessionState();
const kind = new AgentKind(state);
const app = createAgentApp({
  logger,
  kind,
  state,
  endpoints: { policyUrl: extra["policy-url"]!, resourcesUrl: extra["resources-url"]!, stream: extra.stream !== "false" },
  ...(episodeTimeoutMs !== undefined && { episodeTimeoutMs }),
});
await runtime.serve(app, kind);
