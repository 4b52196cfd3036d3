/** pino's numeric levels, as the demo prints them. */
const LEVELS: Readonly<Record<number, string>> = { 10: "trace", 20: "debug", 30: "info", 40: "warn", 50: "error", 60: "fatal" };

/** Fields every line carries, which say nothing to someone watching the demo. */
const NOISE = new Set(["level", "time", "pid", "hostname", "name", "msg", "trace_id", "span_id", "trace_flags"]);

/**
 * A child's pino JSON line as a person reads it in the demo's output: `warn: <msg> (key=value, …)`.
 * Anything else (progress lines, plain text) is returned as it came.
 */
export function readableLogLine(line: string): string {
  if (!line.startsWith("{")) return line;
  let entry: unknown;
  try {
    entry = JSON.parse(line);
  } catch {
    return line;
  }
  if (entry === null || typeof entry !== "object" || Array.isArray(entry)) return line;
  const { level, msg } = entry as { level?: unknown; msg?: unknown };
  const label = typeof level === "number" ? LEVELS[level] : undefined;
  if (label === undefined || typeof msg !== "string") return line;
  const fields = Object.entries(entry)
    .filter(([key]) => !NOISE.has(key))
    .map(([key, value]) => `${key}=${typeof value === "string" ? value : JSON.stringify(value)}`);
  return fields.length ? `${label}: ${msg} (${fields.join(", ")})` : `${label}: ${msg}`;
}
