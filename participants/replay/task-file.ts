import { readFile } from "node:fs/promises";
import { invalidRequest } from "./errors.js";

/**
 * The tasks of a task file given on the command line (`seeds --tasks`): JSON lines, each collect's
 * `{id, task}` row or a bare task (a replay run, such as a `/replay/next` reply, is one: kept whole). Blank lines are skipped. A missing, unreadable or malformed file
 * is `invalid_request`, like any bad flag value (a pipe such as `<(…)` is read as it comes).
 */
export async function readTaskFile(file: string): Promise<unknown[]> {
  let text: string;
  try {
    text = await readFile(file, "utf8");
  } catch (error) {
    const why = (error as NodeJS.ErrnoException).code === "ENOENT" ? "does not exist" : `cannot be read (${(error as Error).message})`;
    throw invalidRequest(`tasks file ${file} ${why}`, { cause: error });
  }
  const out: unknown[] = [];
  for (const [i, line] of text.split("\n").entries()) {
    if (!line.trim()) continue;
    let value: unknown;
    try {
      value = JSON.parse(line);
    } catch {
      throw invalidRequest(`${file}:${i + 1}: not JSON`);
    }
    const row = value as { id?: unknown; task?: unknown };
    out.push(row && typeof row === "object" && "id" in row && "task" in row ? row.task : value);
  }
  return out;
}
