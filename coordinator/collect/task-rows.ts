import { constants as bufferConstants } from "node:buffer";
import { closeSync, constants, createReadStream, fstatSync, open } from "node:fs";
import { Socket } from "node:net";
import type { Readable } from "node:stream";
import { ReadStream as TtyReadStream, isatty } from "node:tty";
import { z } from "zod";
import { CheckpointError, MAX_JSON_DEPTH, MAX_ROLLOUT_ID_CHARS, RolloutIdSchema, SAFE_NAME_PATTERN, describeZodError, duplicateJsonKey, isUnreadableStorage, jsonNestsDeeperThan, namePath, textLines, unsafeJsonInteger } from "../../protocol/index.js";

/**
 * One line of `tasks.jsonl`: either `{"id": "...", "task": {...}}` or a bare task object, which
 * gets the id `row-<line number>`. Ids (with `--rollout-id-prefix` in front) must be valid rollout
 * ids and unique.
 */
const TaskLineSchema = z.object({ id: RolloutIdSchema, task: z.record(z.string(), z.unknown()) }).strict();

export interface TaskRow {
  rolloutId: string;
  task: Record<string, unknown>;
}

/**
 * The longest tasks line, newline included: the longest string Node decodes a buffer to (about
 * 512 MiB). A longer line is refused (`invalid_request`) once that many bytes came without a
 * newline, never held whole: read as one string it threw V8's RangeError out of the stream's data
 * handler, an uncaught exception. Smaller only in tests.
 */
export const MAX_TASK_LINE_BYTES = bufferConstants.MAX_STRING_LENGTH;

/**
 * What may come before a row's id (`--rollout-id-prefix`): the start of a rollout id. The model
 * proxy keeps each capture key's ledger for good, so a later collection sending the same ids at the
 * same attempts to that Gym would continue the earlier one's lineage; a prefix per run keeps them apart.
 */
export function isRolloutIdPrefix(prefix: string): boolean {
  return prefix === "" || (SAFE_NAME_PATTERN.test(prefix) && prefix.length < MAX_ROLLOUT_ID_CHARS);
}

/**
 * Streamed line by line (as results.jsonl is): a tasks file may be larger than one string can be.
 * `signal` gives the read up (rejecting with its reason), even one that never delivers. `idPrefix`
 * goes in front of every row's id (written or `row-<line>`): the rollout id is the whole of it.
 */
export async function readTaskRows(
  path: string,
  { signal, maxLineBytes = MAX_TASK_LINE_BYTES, idPrefix = "" }: { signal?: AbortSignal; maxLineBytes?: number; idPrefix?: string } = {},
): Promise<TaskRow[]> {
  const rows: TaskRow[] = [];
  const seen = new Set<string>();
  let input: Readable | undefined;
  const giveUp = () => input?.destroy(signal!.reason as Error);
  signal?.addEventListener("abort", giveUp, { once: true });
  const tooLong = (number: number) => new CheckpointError("invalid_request", `${path}:${number}: longer than any task line can be (over ${maxLineBytes} bytes without a newline)`);
  try {
    signal?.throwIfAborted();
    input = await openTasks(path);
    if (signal?.aborted) giveUp(); // aborted while opening
    for await (const { text: line, number } of textLines(input, maxLineBytes, tooLong)) {
      if (!line.trim()) continue;
      let value: unknown;
      try {
        value = JSON.parse(line);
      } catch {
        throw new CheckpointError("invalid_request", `${path}:${number}: not JSON`);
      }
      // JSON.parse keeps the last of a key named twice and rounds an integer past 2^53: the task sent
      // would not be the one written (and, sent re-serialised, the Gym could not tell).
      const twice = duplicateJsonKey(line);
      if (twice !== undefined) throw new CheckpointError("invalid_request", `${path}:${number}: names key ${JSON.stringify(twice)} twice in one object`);
      const unsafe = unsafeJsonInteger(line);
      if (unsafe !== undefined) throw new CheckpointError("invalid_request", `${path}:${number}: holds integer ${unsafe}, past what a double holds exactly (it would be sent as ${Number(unsafe)}); write it as a string`);
      const written = value !== null && typeof value === "object" && "task" in value && "id" in value ? (value as { id: unknown }) : undefined;
      const withId = written ? { ...written, id: typeof written.id === "string" ? `${idPrefix}${written.id}` : written.id } : { id: `${idPrefix}row-${number}`, task: value };
      const parsed = TaskLineSchema.safeParse(withId);
      if (!parsed.success) throw new CheckpointError("invalid_request", `${path}:${number}: ${describeZodError(parsed.error)}`);
      // The /run body carrying it may nest MAX_JSON_DEPTH levels: refused here, not by every attempt.
      if (jsonNestsDeeperThan(parsed.data.task, MAX_JSON_DEPTH - 1)) throw new CheckpointError("invalid_request", `${path}:${number}: the task nests more than ${MAX_JSON_DEPTH - 1} levels deep`);
      if (seen.has(parsed.data.id)) throw new CheckpointError("invalid_request", `${path}:${number}: duplicate id ${parsed.data.id}`);
      seen.add(parsed.data.id);
      rows.push({ rolloutId: parsed.data.id, task: parsed.data.task });
    }
    signal?.throwIfAborted(); // never a part of the rows for all of them
  } catch (error) {
    if (error instanceof CheckpointError) throw error;
    if (signal?.aborted) throw signal.reason;
    // The storage refusing the read (EIO, EACCES, a stale handle) is no fault of the flag: thrown as
    // it is, storage_error (exit 1). Only a file that is not there or not readable as one is.
    if (isUnreadableStorage(error)) throw namePath(error, path);
    const code = (error as NodeJS.ErrnoException).code;
    throw new CheckpointError("invalid_request", `tasks file ${path} ${code === "ENOENT" ? "does not exist" : `is not readable (${code ?? String(error)})`}`);
  } finally {
    signal?.removeEventListener("abort", giveUp);
    input?.destroy(); // a refused line leaves the rest unread
  }
  return rows;
}

/**
 * A FIFO or pipe (`/dev/stdin` after `|`, `<(…)`) is read through the event loop: opened
 * non-blocking, its open waits for no writer, and its read for no data on a libuv thread, where a
 * writer that stays silent would block it for good, and with it the process's exit. A terminal
 * likewise. Anything else (a regular file, which ignores the flag) is read as a file. What it is
 * comes from the descriptor opened, not from the path asked again (which may have changed).
 */
async function openTasks(path: string): Promise<Readable> {
  const fd = await new Promise<number>((resolve, reject) =>
    open(path, constants.O_RDONLY | constants.O_NONBLOCK, (error, fd) => (error ? reject(error) : resolve(fd))),
  );
  try {
    if (fstatSync(fd).isFIFO()) return new Socket({ fd, readable: true, writable: false });
    if (isatty(fd)) return new TtyReadStream(fd);
    return createReadStream("", { fd });
  } catch (error) {
    closeSync(fd);
    throw error;
  }
}
