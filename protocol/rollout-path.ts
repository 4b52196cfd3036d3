import { parseCaptureKey, type EpisodeId } from "./ids.js";

/**
 * Episode-scoped data-plane calls carry the rollout identity as a path prefix:
 *   /ng-rollout/<capture_key>/<route>      e.g. /ng-rollout/r-a1/v1/chat/completions
 */
export const ROLLOUT_PREFIX = "/ng-rollout/";

export interface RolloutPath {
  episode: EpisodeId;
  captureKey: string;
  /** The route after the prefix, starting with "/". */
  route: string;
}

/** undefined when the path has no prefix; throws nothing — callers decide how to refuse. */
export function parseRolloutPath(path: string): RolloutPath | undefined | "invalid" {
  if (!path.startsWith(ROLLOUT_PREFIX)) return undefined;
  const rest = path.slice(ROLLOUT_PREFIX.length);
  const slash = rest.indexOf("/");
  let key: string;
  try {
    key = decodeURIComponent(slash === -1 ? rest : rest.slice(0, slash));
  } catch {
    return "invalid"; // malformed percent-encoding (URIError)
  }
  const episode = parseCaptureKey(key);
  if (!episode) return "invalid";
  return { episode, captureKey: key, route: slash === -1 ? "/" : rest.slice(slash) };
}

export function rolloutPath(captureKey: string, route: string): string {
  return `${ROLLOUT_PREFIX}${encodeURIComponent(captureKey)}${route.startsWith("/") ? route : `/${route}`}`;
}
