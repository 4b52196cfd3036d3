/**
 * A tasks file's line, as `collect --tasks` and `seeds --tasks` both read it: a row `{id, task}`
 * (what collect's own files and a replay run hold) or a bare task. The row, when `value` is one.
 */
export function taskRowOf(value: unknown): { id: unknown; task: unknown } | undefined {
  return value !== null && typeof value === "object" && "task" in value && "id" in value ? (value as { id: unknown; task: unknown }) : undefined;
}

/** The task a line's value carries: a row's `task`, else the value itself. */
export function taskOfLine(value: unknown): unknown {
  const row = taskRowOf(value);
  return row ? row.task : value;
}
