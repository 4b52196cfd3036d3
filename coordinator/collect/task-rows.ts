import { constants as bufferConstants, isUtf8 } from "node:buffer";
import { closeSync, constants, createReadStream, fstatSync, open } from "node:fs";
import { createHash } from "node:crypto";
import { Socket } from "node:net";
import { resolve } from "node:path";
import type { Readable } from "node:stream";
import { ReadStream as TtyReadStream, isatty } from "node:tty";
import { z } from "zod";
import { CheckpointError, MAX_JSON_DEPTH, MAX_ROLLOUT_ID_CHARS, RolloutIdSchema, SAFE_NAME_PATTERN, describeZodError, duplicateJsonKey, isUnreadableStorage, jsonNestsDeeperThan, keepingProtoKey, namePath, taskOfLine, taskRowOf, textLines, unsafeJsonInteger } from "../../protocol/index.js";
import { TaskFile } from "./task-file.js";

/**
 * One line of `tasks.jsonl`: either `{"id": "...", "task": {...}}` or a bare task object, which
 * gets the id `row-<line number>`. Ids (with `--rollout-id-prefix` in front) must be valid rollout
 * ids and unique.
 */
// The task keeps a `__proto__` key as written: zod's record would leave it out of the task sent.
const TaskLineSchema = z.object({ id: RolloutIdSchema, task: keepingProtoKey(z.record(z.string(), z.unknown())) }).strict();

export interface TaskRow {
  rolloutId: string;
  /** The task, or (read from a regular file) where its line is: read again, from the file as opened at start-up, when the row is sent (`loadTask`). */
  task: Record<string, unknown> | TaskLineRef;
}

/**
 * Where a validated task is in a regular tasks file: its line is read again (through the file's
 * descriptor kept open since start-up, `TaskFile`), and checked unchanged by its sha256, each time
 * the row is sent. A task held parsed costs about its bytes of heap, for the whole collection:
 * 500,000 tasks of 8 KB would take 3.9 GB, Node's whole default heap, before a row is sent. A FIFO or
 * terminal cannot be read again: its tasks are held parsed all the same.
 */
export class TaskLineRef {
  constructor(
    readonly file: TaskFile,
    readonly number: number,
    readonly offset: number,
    readonly byteLength: number,
    /** sha256 (base64) of the line's text as validated. */
    readonly digest: string,
  ) {}
}

/**
 * A row's task: as held, or its line read again from the tasks file as opened at start-up (a file
 * replaced by `mv` or removed since is still read as it was). A line changed since it was validated
 * (the file edited in place or cut mid-collection) is refused (`invalid_request`), never sent: the
 * task run would not be the one checked and logged.
 */
export async function loadTask(row: TaskRow): Promise<Record<string, unknown>> {
  const ref = row.task;
  if (!(ref instanceof TaskLineRef)) return ref;
  const { path } = ref.file;
  let bytes: Buffer;
  try {
    bytes = await ref.file.read(ref.offset, ref.byteLength);
  } catch (error) {
    throw tasksFileError(error, path);
  }
  // Checked on the bytes: the digest is of the text as decoded, and a line edited in place into bytes
  // that are not UTF-8 may decode to the very text validated (U+FFFD written, U+FFFD decoded).
  if (!isUtf8(bytes)) throw new CheckpointError("invalid_request", `${path}:${ref.number}: not UTF-8 text any more (changed since this collection read it); save the tasks file as UTF-8 and restart the collection`);
  const text = bytes.toString("utf8");
  const changed = new CheckpointError("invalid_request", `${path}:${ref.number}: changed since this collection read it (its tasks are read again as rows are sent); restart the collection to run the file as it is now`);
  if (lineDigest(text) !== ref.digest) throw changed;
  // Through the schema as when validated, so the task sent is the one a held row would send.
  return TaskLineSchema.parse({ id: row.rolloutId, task: taskOfLine(JSON.parse(text) as unknown) }).task;
}

/** Closes the tasks file the rows' lines are read from (none for tasks held in memory); again, a no-op. The collector's to call when it ends. */
export async function closeTaskRows(rows: readonly TaskRow[]): Promise<void> {
  const files = new Set<TaskFile>();
  for (const { task } of rows) if (task instanceof TaskLineRef) files.add(task.file);
  await Promise.all([...files].map((file) => file.close()));
}

function lineDigest(text: string): string {
  return createHash("sha256").update(text).digest("base64");
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
 * A regular file's rows keep it open (`TaskFile`) until `closeTaskRows`; rows refused or none hold nothing open.
 */
export async function readTaskRows(
  path: string,
  {
    signal,
    maxLineBytes = MAX_TASK_LINE_BYTES,
    idPrefix = "",
    onProgress,
    progressEveryMs = 1000,
  }: {
    signal?: AbortSignal;
    maxLineBytes?: number;
    idPrefix?: string;
    /** Told the rows read and the bytes they took so far, once `progressEveryMs` passed since the read began and at most that often after. */
    onProgress?: (rows: number, bytes: number) => void;
    progressEveryMs?: number;
  } = {},
): Promise<TaskRow[]> {
  const rows: TaskRow[] = [];
  const seen = new Set<string>();
  let input: Readable | undefined;
  let file: TaskFile | undefined;
  const giveUp = () => input?.destroy(signal!.reason as Error);
  signal?.addEventListener("abort", giveUp, { once: true });
  const tooLong = (number: number) => new CheckpointError("invalid_request", `${path}:${number}: longer than any task line can be (over ${maxLineBytes} bytes without a newline)`);
  try {
    signal?.throwIfAborted();
    ({ input, file } = await openTasks(path));
    if (signal?.aborted) giveUp(); // aborted while opening
    let progressAt = performance.now() + progressEveryMs;
    for await (const { text: line, number, offset, byteLength, utf8 } of textLines(input, maxLineBytes, tooLong)) {
      if (onProgress && performance.now() >= progressAt) {
        progressAt = performance.now() + progressEveryMs;
        onProgress(rows.length, offset);
      }
      if (!line.trim()) continue;
      // Decoded anyway, each bad sequence as U+FFFD: the task sent (and recorded) would not be the one written.
      if (!utf8) throw new CheckpointError("invalid_request", `${path}:${number}: not UTF-8 text (a Latin-1 or UTF-16 export?); save the tasks file as UTF-8`);
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
      const written = taskRowOf(value);
      const withId = written ? { ...written, id: typeof written.id === "string" ? `${idPrefix}${written.id}` : written.id } : { id: `${idPrefix}row-${number}`, task: value };
      const parsed = TaskLineSchema.safeParse(withId);
      if (!parsed.success) throw new CheckpointError("invalid_request", `${path}:${number}: ${describeZodError(parsed.error)}`);
      // The /run body carrying it may nest MAX_JSON_DEPTH levels: refused here, not by every attempt.
      if (jsonNestsDeeperThan(parsed.data.task, MAX_JSON_DEPTH - 1)) throw new CheckpointError("invalid_request", `${path}:${number}: the task nests more than ${MAX_JSON_DEPTH - 1} levels deep`);
      if (seen.has(parsed.data.id)) throw new CheckpointError("invalid_request", `${path}:${number}: duplicate id ${parsed.data.id}`);
      seen.add(parsed.data.id);
      rows.push({ rolloutId: parsed.data.id, task: file ? new TaskLineRef(file, number, offset, byteLength, lineDigest(line)) : parsed.data.task });
    }
    signal?.throwIfAborted(); // never a part of the rows for all of them
  } catch (error) {
    await file?.close();
    if (signal?.aborted && !(error instanceof CheckpointError)) throw signal.reason;
    throw tasksFileError(error, path);
  } finally {
    signal?.removeEventListener("abort", giveUp);
    // A refused line leaves the rest unread. The stream closes its descriptor after destroy() returns:
    // waited for, so a refused read (or the rows, which hold only the TaskFile's) holds nothing more.
    if (input) {
      const stream = input;
      stream.destroy();
      if (!stream.closed) await new Promise((resolve) => stream.once("close", resolve));
    }
  }
  if (!rows.length) await file?.close(); // no row reads it again
  return rows;
}

function tasksFileError(error: unknown, path: string): unknown {
  if (error instanceof CheckpointError) return error;
  // The storage refusing the read (EIO, EACCES, a stale handle) is no fault of the flag: thrown as
  // it is, storage_error (exit 1). Only a file that is not there or not readable as one is.
  if (isUnreadableStorage(error)) return namePath(error, path);
  const code = (error as NodeJS.ErrnoException).code;
  return new CheckpointError("invalid_request", `tasks file ${path} ${code === "ENOENT" ? "does not exist" : `is not readable (${code ?? String(error)})`}`);
}

/**
 * A FIFO or pipe (`/dev/stdin` after `|`, `<(…)`) is read through the event loop: opened
 * non-blocking, its open waits for no writer, and its read for no data on a libuv thread, where a
 * writer that stays silent would block it for good, and with it the process's exit. A terminal
 * likewise. Anything else (a regular file, which ignores the flag) is read as a file. What it is
 * comes from the descriptor opened, not from the path asked again (which may have changed). A
 * regular file is also opened as the `TaskFile` its rows' lines are read again from (the stream
 * closes its own descriptor when it ends).
 */
async function openTasks(path: string): Promise<{ input: Readable; file?: TaskFile }> {
  const fd = await new Promise<number>((resolve, reject) =>
    open(path, constants.O_RDONLY | constants.O_NONBLOCK, (error, fd) => (error ? reject(error) : resolve(fd))),
  );
  try {
    const stats = fstatSync(fd);
    if (stats.isFIFO()) return { input: new Socket({ fd, readable: true, writable: false }) };
    if (isatty(fd)) return { input: new TtyReadStream(fd) };
    // Before the stream owns the descriptor (a refused open closes it below). Its absolute path names
    // the lines it refuses.
    const file = stats.isFile() ? await TaskFile.openAs(resolve(path), stats) : undefined;
    return { input: createReadStream("", { fd }), ...(file && { file }) };
  } catch (error) {
    closeSync(fd);
    throw error;
  }
}
