import { constants } from "node:buffer";
import { createReadStream } from "node:fs";
import { isUnreadableStorage, namePath, taskOfLine, textLines } from "../../protocol/index.js";
import { invalidRequest, ReplayError } from "./errors.js";

/**
 * The longest task line, newline included: the longest string Node decodes a buffer to (about
 * 512 MiB). A longer one is refused (`invalid_request`) once that many bytes came without a newline,
 * never held whole. Smaller only in tests.
 */
export const MAX_TASK_FILE_LINE_BYTES = constants.MAX_STRING_LENGTH;

/**
 * The tasks of a task file given on the command line (`seeds --tasks`): JSON lines, each collect's
 * `{id, task}` row or a bare task (a replay run, such as a `/replay/next` reply, is one: kept whole). Blank lines are skipped. A missing or malformed file
 * (a line that is not JSON, or not UTF-8 text, as `collect --tasks` refuses it)
 * (or a directory) is `invalid_request`, like any bad flag value; one the storage refuses to read (EIO,
 * EACCES) is thrown as it is, storage_error (a pipe such as `<(…)` is read as it comes).
 * Streamed line by line, as collect reads it: a task file may be larger than one string can be.
 */
export async function readTaskFile(file: string, maxLineBytes = MAX_TASK_FILE_LINE_BYTES): Promise<unknown[]> {
  const out: unknown[] = [];
  const input = createReadStream(file);
  const tooLong = (number: number) => invalidRequest(`${file}:${number}: longer than any task line can be (over ${maxLineBytes} bytes without a newline)`);
  try {
    for await (const { text: line, number, utf8 } of textLines(input, maxLineBytes, tooLong)) {
      if (!line.trim()) continue;
      // Decoded anyway, each bad sequence as U+FFFD: the seed would carry a task that was never run.
      if (!utf8) throw invalidRequest(`${file}:${number}: not UTF-8 text (a Latin-1 or UTF-16 export?); save the tasks file as UTF-8`);
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch {
        throw invalidRequest(`${file}:${number}: not JSON`);
      }
      out.push(taskOfLine(value));
    }
  } catch (error) {
    if (error instanceof ReplayError) throw error;
    // The storage refusing the read (EIO, EACCES, a stale handle) is no fault of the flag: thrown as
    // it is, storage_error (exit 1), as collect reads the same file. Only a file that is not there
    // or not readable as one (a directory) is invalid_request.
    if (isUnreadableStorage(error)) throw namePath(error, file);
    const why = (error as NodeJS.ErrnoException).code === "ENOENT" ? "does not exist" : `cannot be read (${(error as Error).message})`;
    throw invalidRequest(`tasks file ${file} ${why}`, { cause: error });
  } finally {
    input.destroy(); // a refused line leaves the rest unread
  }
  return out;
}
