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
