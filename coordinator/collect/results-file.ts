import { constants } from "node:buffer";
import { createReadStream } from "node:fs";
import { appendFile, open, stat, truncate, type FileHandle } from "node:fs/promises";
import { dirname } from "node:path";
import { z } from "zod";
import { CheckpointError, EpisodeIdSchema, JsonObjectSchema, jsonTextWithin, namePath, textLines } from "../../protocol/index.js";
import { fsyncDirectory } from "../publication/durable-fs.js";
import { parseStateValue } from "./state-file-value.js";

/** One finished row in `results.jsonl`; appended as rows finish, so a crash keeps every finished row. */
export const ResultLineSchema = z
  .object({
    rollout_id: EpisodeIdSchema.shape.rollout_id,
    attempt: EpisodeIdSchema.shape.attempt,
    reward: z.number(),
    continued: z.boolean(),
    finished_at: z.number(),
    // The /run reply as received: a record would leave out a key named __proto__, from the line
    // written and from one read back.
    response: JsonObjectSchema,
  })
  .strict();
export type ResultLine = z.infer<typeof ResultLineSchema>;

/**
 * The longest line start-up reads, newline included: the longest string Node decodes a buffer to
 * (about 512 MiB; a line holds one `/run` reply, at most 64 MiB as received, or `--max-run-reply-mib`, at most 256 MiB). A longer middle line is
 * refused (invalid_checkpoint_state) once that many bytes came without a newline, and a longer torn
 * tail is cut unread: neither is held whole, nor made into a string V8 refuses (which became
 * internal_error). Smaller only in tests.
 */
export const MAX_RESULT_LINE_BYTES = constants.MAX_STRING_LENGTH;

/** Lengths failed appends could not be cut back to: the next append to the path cuts first. */
const pendingCuts = new Map<string, number>();

/** Appends and syncs in progress per file: the next one to a path waits for the previous one. */
const appendTails = new Map<string, Promise<void>>();

/** Appends whose write is under way per file: once begun, a write cannot be called back. */
const writing = new Map<string, number>();

/** Per file with a write under way and someone waiting: settles once none is (resultWritesEnded). */
const writesEnded = new Map<string, { ended: Promise<void>; end: () => void }>();

/**
 * Per file: the length its last good sync put on disk, and a failed sync, after which nothing of it
 * is trusted. Linux reports a failed writeback (EIO) once, to the descriptor that synced, and marks
 * the pages clean: a sync on a new descriptor then succeeds though the lines never reached the disk
 * (they read back from memory until a power loss). So the failure is final: the lines since the
 * last good sync are cut off (`cut`) and every later sync or append is refused. Their rows run again
 * at the next start (the dispatch log names their attempts): simpler than rewriting the tail from
 * memory, which would keep every line until its sync, and no row is counted durable before it is.
 */
const durability = new Map<string, { synced?: number; failure?: CheckpointError; cut?: boolean; entry?: boolean }>();

/**
 * One result's line, newline included; refused (`payload_too_large`) when it would be longer than
 * `maxLineBytes`, what every start-up reads: appended, it would refuse every later start. A reply
 * can grow when written again (`9E20`, four characters, is 21 digits as JSON), so a reply within
 * `--max-run-reply-mib` is no proof.
 */
export function resultLineText(line: ResultLine, maxLineBytes = MAX_RESULT_LINE_BYTES): string {
  const tooLarge = (size: string) =>
    new CheckpointError("payload_too_large", `the results.jsonl line of ${line.rollout_id} (attempt ${line.attempt}) would be ${size}, over the ${maxLineBytes}-byte limit every start reads`);
  const json = jsonTextWithin(ResultLineSchema.parse(line), () => tooLarge("longer than the longest string"));
  const size = Buffer.byteLength(json) + 1;
  if (size > maxLineBytes) throw tooLarge(`${size} bytes`);
  return `${json}\n`;
}

/**
 * Appends one line (refused before anything is written when it is longer than `maxLineBytes`, see
 * resultLineText). Appends to one file run one at a time: fs.appendFile writes in 512 KiB chunks,
 * so two concurrent appends of longer lines would interleave mid-line.
 */
export async function appendResult(path: string, line: ResultLine, maxLineBytes = MAX_RESULT_LINE_BYTES): Promise<void> {
  return appendResultText(path, resultLineText(line, maxLineBytes));
}

/**
 * Appends a line resultLineText made, after the appends to `path` before it. Once `givenUp` is
 * aborted (its writer decided its outcome without waiting for this append: storage that hangs), an
 * append that has not begun its write never begins it and rejects with the signal's reason. The
 * signal is the writer's own: a later writer of the same file in this process is not refused, nor
 * does it let this writer's given-up lines land.
 */
export function appendResultText(path: string, text: string, givenUp?: AbortSignal): Promise<void> {
  return queued(path, () => appendWhole(path, text, givenUp));
}

/** Runs `step` after the appends and syncs of `path` queued before it. */
function queued(path: string, step: () => Promise<void>): Promise<void> {
  const done = (appendTails.get(path) ?? Promise.resolve()).then(step);
  const tail = done.catch(() => undefined);
  appendTails.set(path, tail);
  void tail.then(() => {
    if (appendTails.get(path) === tail) appendTails.delete(path);
  });
  return done;
}

/**
 * Appends `text`, or nothing: an append that failed part way (a full disk after its first chunks)
 * is cut off again, since the next append (queued behind it) would land after the fragment and
 * leave it mid-file, where no start-up can read past it.
 */
async function appendWhole(path: string, text: string, givenUp: AbortSignal | undefined): Promise<void> {
  // After a failed sync no line lands: whether it reached the disk could never be known.
  const failure = durability.get(path)?.failure;
  if (failure) throw failure;
  givenUp?.throwIfAborted();
  // A fragment whose cut failed (below) is cut first: this append must not land after it. Failing
  // again, this append is refused too, rather than leaving the fragment mid-file.
  const cut = pendingCuts.get(path);
  if (cut !== undefined) {
    await truncate(path, cut).catch((error: unknown) => {
      throw namePath(error, path);
    });
    pendingCuts.delete(path);
  }
  // Unknown (the file cannot be looked at): nothing is cut.
  const before = await sizeIfExists(path).then((size) => size ?? 0, () => undefined);
  // Looked at again: the cut and the size read are storage too, and may have hung past the give-up.
  givenUp?.throwIfAborted();
  writing.set(path, (writing.get(path) ?? 0) + 1);
  try {
    await appendFile(path, text);
  } catch (error) {
    if (before !== undefined) await truncate(path, before).catch(() => void pendingCuts.set(path, before));
    // A failed write names no path (a full disk's ENOSPC): the refusal should.
    throw namePath(error, path);
  } finally {
    const left = writing.get(path)! - 1;
    if (left > 0) writing.set(path, left);
    else {
      writing.delete(path);
      writesEnded.get(path)?.end();
      writesEnded.delete(path);
    }
  }
}

/**
 * Whether an append's write to `path` is under way (begun, not yet returned): it cannot be called
 * back, so its line may still land, whole or as a torn last line the next start cuts off.
 */
export function resultWriteUnderWay(path: string): boolean {
  return writing.has(path);
}

/**
 * Settles once no append's write to `path` is under way (a failed one cut back first): what was
 * written is then there for good, whole or not at all (a torn last line only after a crash).
 */
export function resultWritesEnded(path: string): Promise<void> {
  if (!writing.has(path)) return Promise.resolve();
  let waiting = writesEnded.get(path);
  if (!waiting) {
    let end!: () => void;
    const ended = new Promise<void>((resolve) => (end = resolve));
    waiting = { ended, end };
    writesEnded.set(path, waiting);
  }
  return waiting.ended;
}

/** Settles once the appends and syncs queued for `path` so far have ended (each its own way). */
export function resultAppendsSettled(path: string): Promise<void> {
  return appendTails.get(path) ?? Promise.resolve();
}

/**
 * Puts the lines appended to `path` so far on disk (fdatasync): before anything durable that counts
 * its rows is published (their rollout records), since a power loss that kept that but lost the
 * lines would run those rows again, and record them twice. Queued behind the appends before it,
 * so what it synced ends at a line's end. A failed fdatasync is final (see `durability`): the
 * lines since the last good sync are cut off, and this and every later sync and append of the
 * file are refused (`storage_error`).
 */
export function syncResults(path: string): Promise<void> {
  return queued(path, async () => {
    const failure = durability.get(path)?.failure;
    if (failure) throw failure;
    let handle: FileHandle;
    try {
      handle = await open(path, "r+");
    } catch (error) {
      throw namePath(error, path); // nothing synced, nothing failed to sync: tried again next time
    }
    try {
      const { size } = await handle.stat();
      try {
        await handle.datasync();
      } catch (error) {
        throw await distrust(path, handle, namePath(error, path));
      }
      // A file made since the start: its name is on disk only once its directory is synced too. A
      // failure there is final as well (a retry on a new descriptor could succeed just the same).
      if (durability.get(path)?.entry !== true) {
        try {
          await fsyncDirectory(dirname(path));
        } catch (error) {
          const why = error instanceof Error ? error.message : String(error);
          const failure = new CheckpointError("storage_error", `${path}: fsync of its directory failed (${why}): the file may not be on disk at all, so no later sync of it is trusted`, { cause: error });
          durability.set(path, { ...durability.get(path), failure, cut: false });
          throw failure;
        }
      }
      // A fragment a failed append could not cut is no synced line: a cut back to here leaves it out.
      durability.set(path, { synced: Math.min(size, pendingCuts.get(path) ?? size), entry: true });
    } finally {
      await handle.close().catch(() => undefined);
    }
  });
}

/** A failed sync of `path`: cuts what came after the last good one, and remembers the failure. */
async function distrust(path: string, handle: FileHandle, error: unknown): Promise<CheckpointError> {
  const { synced } = durability.get(path) ?? {};
  const why = error instanceof Error ? error.message : String(error);
  let cut = false;
  let outcome: string;
  if (synced === undefined) {
    outcome = "how much of it an earlier sync put on disk is not known, so nothing is cut";
  } else {
    try {
      await handle.truncate(synced);
      await handle.sync();
      cut = true;
      outcome = `the lines appended since the last good sync are cut off (back to ${synced} bytes): their rows are run again at the next start`;
    } catch (cutError) {
      outcome = `cutting off the lines appended since the last good sync (back to ${synced} bytes) failed too (${cutError instanceof Error ? cutError.message : String(cutError)}): a start may take their rows for finished`;
    }
  }
  const failure = new CheckpointError(
    "storage_error",
    `${path}: fdatasync failed (${why}); what was appended since the last good sync may not be on disk though it reads back, so no later sync of it is trusted: ${outcome}`,
    { cause: error },
  );
  durability.set(path, { ...durability.get(path), failure, cut });
  return failure;
}

/**
 * Makes `path` exist, empty and on disk with its directory entry, unless it is there: a collection
 * does this before its first `/run`. A later `--new-collection` tells "this collection finished no
 * row" (an empty file) from "its --out is gone" (no file) by it: without it, abandoning a collection
 * stopped before its first row finished could not tell which of its attempts to retire.
 */
export function createResultsIfAbsent(path: string): Promise<void> {
  return queued(path, async () => {
    let handle: FileHandle;
    try {
      handle = await open(path, "wx");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "EEXIST") return;
      throw namePath(error, path);
    }
    try {
      await handle.sync();
    } finally {
      await handle.close().catch(() => undefined);
    }
    await fsyncDirectory(dirname(path));
    durability.set(path, { synced: 0, entry: true });
  });
}

/** A finished row as readers need it: the `/run` reply itself stays in the file. */
export type FinishedRow = Omit<ResultLine, "response">;

/** Finished rows by rollout id, for readers beside a running collector: a torn last line (an append in progress or cut by a crash) is ignored. */
export async function readResults(path: string, maxLineBytes = MAX_RESULT_LINE_BYTES): Promise<Map<string, FinishedRow>> {
  const size = await sizeIfExists(path);
  return size === undefined ? new Map() : readLines(path, await wholeLinesEnd(path, size), maxLineBytes);
}

/**
 * A dead collector's --out as its own restart would read it, without repairing it: undefined when
 * the file is not there (moved or deleted since), and a last line that is a whole record which only
 * lost its newline counts, as readResultsForAppend counts it (a row it leaves out is taken for
 * unfinished, and retiring a finished row deletes its model ledger).
 */
export async function readResultsIfPresent(path: string, maxLineBytes = MAX_RESULT_LINE_BYTES): Promise<Map<string, FinishedRow> | undefined> {
  const size = await sizeIfExists(path);
  if (size === undefined) return undefined;
  const end = await wholeLinesEnd(path, size);
  const rows = await readLines(path, end, maxLineBytes);
  if (end === size) return rows;
  const handle = await open(path, "r");
  try {
    const tail = await wholeTail(handle, path, end, size, maxLineBytes);
    if (tail) rows.set(tail.rollout_id, tail);
  } finally {
    await handle.close();
  }
  return rows;
}

/**
 * The collector's own start-up read, which also repairs a crash mid-append: the torn last line is
 * cut off, or, when it is a whole record that only lost its newline, the newline is added (and the
 * row counts). Otherwise the next append would land after the fragment, leaving it mid-file. The
 * file is synced even when nothing was repaired: the lines an earlier run appended count as
 * finished from now on, and that sync is the length a failed sync later cuts back to. Refused
 * (`storage_error`) when that sync fails, and in a process whose failed sync could not cut the
 * lines it distrusted.
 */
export async function readResultsForAppend(path: string, maxLineBytes = MAX_RESULT_LINE_BYTES): Promise<Map<string, FinishedRow>> {
  const before = durability.get(path);
  if (before?.failure && !before.cut) throw before.failure;
  const size = await sizeIfExists(path);
  if (size === undefined) {
    durability.set(path, { synced: 0, entry: false });
    return new Map();
  }
  const end = await wholeLinesEnd(path, size);
  const rows = await readLines(path, end, maxLineBytes);
  const handle = await open(path, "r+");
  try {
    let synced = size;
    let tail: FinishedRow | undefined;
    if (end !== size) {
      tail = await wholeTail(handle, path, end, size, maxLineBytes);
      if (tail) await handle.write("\n", size);
      else await handle.truncate(end);
      synced = tail ? size + 1 : end;
    }
    try {
      await handle.sync();
      // Its name too: the run that made it may not have synced its directory.
      await fsyncDirectory(dirname(path));
    } catch (error) {
      const why = error instanceof Error ? error.message : String(error);
      const failure = new CheckpointError("storage_error", `${path}: fsync at start failed (${why}): the rows earlier runs appended may not be on disk though they read back; check the storage before starting again`, { cause: error });
      durability.set(path, { failure, cut: false }); // not tried again in this process either
      throw failure;
    }
    durability.set(path, { synced, entry: true });
    if (tail) rows.set(tail.rollout_id, tail);
  } finally {
    await handle.close();
  }
  return rows;
}

/**
 * The failed sync of `path` that nothing of it is trusted after (see syncResults), if any, and
 * whether what came after the last good sync was cut off (the rest of the file is on disk then).
 */
export function distrustedResults(path: string): { failure: CheckpointError; cut: boolean } | undefined {
  const state = durability.get(path);
  return state?.failure ? { failure: state.failure, cut: state.cut === true } : undefined;
}

/**
 * Streams the whole lines before byte `end`: a results file keeps every reply verbatim and can
 * outgrow one string (and a heap holding every reply); only what readers need is kept. A line is
 * held only up to `maxLineBytes`: one longer is refused as soon as that many bytes came without a
 * newline.
 */
async function readLines(path: string, end: number, maxLineBytes: number): Promise<Map<string, FinishedRow>> {
  const finished = new Map<string, FinishedRow>();
  if (end === 0) return finished;
  const lines = textLines(createReadStream(path, { start: 0, end: end - 1 }), maxLineBytes, (number) => tooLong(path, number, maxLineBytes));
  for await (const { text: line, number } of lines) {
    if (!line.trim()) continue;
    const { response: _reply, ...row } = parseStateValue(ResultLineSchema, line, `${path}:${number}`);
    finished.set(row.rollout_id, row);
  }
  return finished;
}

function tooLong(path: string, number: number, maxLineBytes: number): CheckpointError {
  return new CheckpointError("invalid_checkpoint_state", `${path}:${number}: longer than any result line can be (over ${maxLineBytes} bytes without a newline)`);
}

/**
 * The bytes after the last newline (`end` to `size`) when they are a whole record that only lost
 * its newline. A tail longer than any line can be is no whole record: never read, never held.
 */
async function wholeTail(handle: FileHandle, path: string, end: number, size: number, maxLineBytes: number): Promise<FinishedRow | undefined> {
  if (size - end > maxLineBytes) return undefined;
  const tailBytes = Buffer.alloc(size - end);
  await handle.read(tailBytes, 0, tailBytes.length, end);
  return tornTail(path, tailBytes.toString("utf8"));
}

/** The last line when it is a whole record that only lost its newline; undefined for a torn fragment. */
function tornTail(path: string, text: string): FinishedRow | undefined {
  try {
    const { response: _reply, ...row } = parseStateValue(ResultLineSchema, text, `${path}:tail`);
    return row;
  } catch {
    return undefined;
  }
}

/** The offset just past the file's last newline (0 if none), found by reading backwards. */
async function wholeLinesEnd(path: string, size: number): Promise<number> {
  const handle = await open(path, "r");
  try {
    const chunk = Buffer.alloc(64 * 1024);
    for (let to = size; to > 0; ) {
      const from = Math.max(0, to - chunk.length);
      const { bytesRead } = await handle.read(chunk, 0, to - from, from);
      const at = chunk.subarray(0, bytesRead).lastIndexOf(0x0a);
      if (at !== -1) return from + at + 1;
      to = from;
    }
    return 0;
  } finally {
    await handle.close();
  }
}

async function sizeIfExists(path: string): Promise<number | undefined> {
  try {
    return (await stat(path)).size;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw error;
  }
}
