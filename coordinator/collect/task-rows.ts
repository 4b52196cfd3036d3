import { createReadStream } from "node:fs";
import { createInterface } from "node:readline";
import { z } from "zod";
import { CheckpointError, RolloutIdSchema, describeZodError, isUnreadableStorage, namePath } from "../../protocol/index.js";

/**
 * One line of `tasks.jsonl`: either `{"id": "...", "task": {...}}` or a bare task object, which
 * gets the id `row-<line number>`. Ids must be valid rollout ids and unique.
 */
const TaskLineSchema = z.object({ id: RolloutIdSchema, task: z.record(z.string(), z.unknown()) }).strict();

export interface TaskRow {
  rolloutId: string;
  task: Record<string, unknown>;
}

/** Streamed line by line (as results.jsonl is): a tasks file may be larger than one string can be. */
export async function readTaskRows(path: string): Promise<TaskRow[]> {
  const rows: TaskRow[] = [];
  const seen = new Set<string>();
  const input = createReadStream(path, { encoding: "utf8" });
  let number = 0;
  try {
    for await (const line of createInterface({ input, crlfDelay: Infinity })) {
      number++;
      if (!line.trim()) continue;
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch {
        throw new CheckpointError("invalid_request", `${path}:${number}: not JSON`);
      }
      const withId = value !== null && typeof value === "object" && "task" in value && "id" in value ? value : { id: `row-${number}`, task: value };
      const parsed = TaskLineSchema.safeParse(withId);
      if (!parsed.success) throw new CheckpointError("invalid_request", `${path}:${number}: ${describeZodError(parsed.error)}`);
      if (seen.has(parsed.data.id)) throw new CheckpointError("invalid_request", `${path}:${number}: duplicate id ${parsed.data.id}`);
      seen.add(parsed.data.id);
      rows.push({ rolloutId: parsed.data.id, task: parsed.data.task });
    }
  } catch (error) {
    if (error instanceof CheckpointError) throw error;
    // The storage refusing the read (EIO, EACCES, a stale handle) is no fault of the flag: thrown as
    // it is, storage_error (exit 1). Only a file that is not there or not readable as one is.
    if (isUnreadableStorage(error)) throw namePath(error, path);
    const code = (error as NodeJS.ErrnoException).code;
    throw new CheckpointError("invalid_request", `tasks file ${path} ${code === "ENOENT" ? "does not exist" : `is not readable (${code ?? String(error)})`}`);
  } finally {
    input.destroy(); // a refused line leaves the rest unread
  }
  return rows;
}
