import { readFile } from "node:fs/promises";
import { z } from "zod";
import { CheckpointError, RolloutIdSchema, describeZodError } from "../../protocol/index.js";

/**
 * One line of `tasks.jsonl`: either `{"id": "...", "task": {...}}` or a bare task object, which
 * gets the id `row-<line number>`. Ids must be valid rollout ids and unique.
 */
const TaskLineSchema = z.object({ id: RolloutIdSchema, task: z.record(z.string(), z.unknown()) }).strict();

export interface TaskRow {
  rolloutId: string;
  task: Record<string, unknown>;
}

export async function readTaskRows(path: string): Promise<TaskRow[]> {
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (error) {
    const code = (error as NodeJS.ErrnoException).code;
    throw new CheckpointError("invalid_request", `tasks file ${path} ${code === "ENOENT" ? "does not exist" : `is not readable (${code ?? String(error)})`}`);
  }
  const rows: TaskRow[] = [];
  const seen = new Set<string>();
  text.split("\n").forEach((line, index) => {
    if (!line.trim()) return;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch {
      throw new CheckpointError("invalid_request", `${path}:${index + 1}: not JSON`);
    }
    const withId =
      value !== null && typeof value === "object" && "task" in value && "id" in value ? value : { id: `row-${index + 1}`, task: value };
    const parsed = TaskLineSchema.safeParse(withId);
    if (!parsed.success) throw new CheckpointError("invalid_request", `${path}:${index + 1}: ${describeZodError(parsed.error)}`);
    if (seen.has(parsed.data.id)) throw new CheckpointError("invalid_request", `${path}:${index + 1}: duplicate id ${parsed.data.id}`);
    seen.add(parsed.data.id);
    rows.push({ rolloutId: parsed.data.id, task: parsed.data.task });
  });
  return rows;
}
