import { CheckpointError } from "../../protocol/index.js";

/**
 * The path as an upstream may read it: percent-decoded, `\` as `/`, empty and `.` segments dropped,
 * `..` resolved, lower case, no trailing slash. Used only to classify a request — a generation route
 * in any other spelling must not pass through untracked. Malformed percent-encoding is refused.
 */
export function canonicalRoute(path: string): string {
  let decoded: string;
  try {
    decoded = decodeURIComponent(path);
  } catch {
    throw new CheckpointError("invalid_request", `malformed percent-encoding in ${path.slice(0, 200)}`);
  }
  const segments: string[] = [];
  for (const segment of decoded.replace(/\\/g, "/").toLowerCase().split("/")) {
    if (segment === "" || segment === ".") continue;
    if (segment === "..") segments.pop();
    else segments.push(segment);
  }
  return `/${segments.join("/")}`;
}

/**
 * Whether `route`'s `..` segments climb above its root (`/../x`, `/%2e%2e/x`, `/v1/..%2f..%2fx`), read
 * as an upstream may (percent-decoded, `\` as `/`; as sent when its encoding is malformed). Forwarded
 * after the upstream's base path, such a route would name a path outside it once resolved.
 */
export function climbsAboveRoot(route: string): boolean {
  if (!/\.|%2e/i.test(route)) return false; // no dot segment at all (every call runs this)
  let decoded: string;
  try {
    decoded = decodeURIComponent(route);
  } catch {
    decoded = route;
  }
  let depth = 0;
  for (const segment of decoded.replace(/\\/g, "/").split("/")) {
    if (segment === "" || segment === ".") continue;
    if (segment !== "..") depth += 1;
    else if (--depth < 0) return true;
  }
  return false;
}
