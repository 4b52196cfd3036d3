import { createReadStream } from "node:fs";
import { createInterface } from "node:readline";
import { invalidRequest, ReplayError } from "./errors.js";

/**
 * The tasks of a task file given on the command line (`seeds --tasks`): JSON lines, each collect's
 * `{id, task}` row or a bare task (a replay run, such as a `/replay/next` reply, is one: kept whole). Blank lines are skipped. A missing, unreadable or malformed file
 * is `invalid_request`, like any bad flag value (a pipe such as `<(…)` is read as it comes).
 * Streamed line by line, as collect reads it: a task file may be larger than one string can be.
 */
export async function readTaskFile(file: string): Promise<unknown[]> {
  const out: unknown[] = [];
  const input = createReadStream(file, { encoding: "utf8" });
  let number = 0;
  try {
    for await (const line of createInterface({ input, crlfDelay: Infinity })) {
      number++;
      if (!line.trim()) continue;
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch {
        throw invalidRequest(`${file}:${number}: not JSON`);
      }
      const row = value as { id?: unknown; task?: unknown };
      out.push(row && typeof row === "object" && "id" in row && "task" in row ? row.task : value);
    }
  } catch (error) {
    if (error instanceof ReplayError) throw error;
    const why = (error as NodeJS.ErrnoException).code === "ENOENT" ? "does not exist" : `cannot be read (${(error as Error).message})`;
    throw invalidRequest(`tasks file ${file} ${why}`, { cause: error });
  } finally {
    input.destroy(); // a refused line leaves the rest unread
  }
  return out;
}
