import { appendFile, open, readFile } from "node:fs/promises";
import { z } from "zod";
import { EpisodeIdSchema } from "../../protocol/index.js";
import { parseStateValue } from "./state-file-value.js";

/** One finished row in `results.jsonl`; appended as rows finish, so a crash keeps every finished row. */
export const ResultLineSchema = z
  .object({
    rollout_id: EpisodeIdSchema.shape.rollout_id,
    attempt: EpisodeIdSchema.shape.attempt,
    reward: z.number(),
    continued: z.boolean(),
    finished_at: z.number(),
    response: z.record(z.string(), z.unknown()),
  })
  .strict();
export type ResultLine = z.infer<typeof ResultLineSchema>;

/** Appends in progress per file: the next append to a path waits for the previous one. */
const appendTails = new Map<string, Promise<void>>();

/**
 * Appends one line. Appends to one file run one at a time: fs.appendFile writes in 512 KiB chunks,
 * so two concurrent appends of longer lines would interleave mid-line.
 */
export function appendResult(path: string, line: ResultLine): Promise<void> {
  const text = `${JSON.stringify(ResultLineSchema.parse(line))}\n`;
  const appended = (appendTails.get(path) ?? Promise.resolve()).then(() => appendFile(path, text));
  const tail = appended.catch(() => undefined);
  appendTails.set(path, tail);
  void tail.then(() => {
    if (appendTails.get(path) === tail) appendTails.delete(path);
  });
  return appended;
}

/** Finished rows by rollout id, for readers beside a running collector: a torn last line (an append in progress or cut by a crash) is ignored. */
export async function readResults(path: string): Promise<Map<string, ResultLine>> {
  const bytes = await readIfExists(path);
  return bytes ? parseResults(path, bytes.subarray(0, bytes.lastIndexOf(0x0a) + 1)) : new Map();
}

/**
 * The collector's own start-up read, which also repairs a crash mid-append: the torn last line is
 * cut off, or, when it is a whole record that only lost its newline, the newline is added (and the
 * row counts). Otherwise the next append would land after the fragment, leaving it mid-file.
 */
export async function readResultsForAppend(path: string): Promise<Map<string, ResultLine>> {
  const bytes = await readIfExists(path);
  if (!bytes) return new Map();
  const end = bytes.lastIndexOf(0x0a) + 1;
  if (end === bytes.length) return parseResults(path, bytes);
  const tail = parseResults(path, bytes.subarray(end), true);
  const handle = await open(path, "r+");
  try {
    if (tail.size) await handle.write("\n", bytes.length);
    else await handle.truncate(end);
    await handle.sync();
  } finally {
    await handle.close();
  }
  return new Map([...parseResults(path, bytes.subarray(0, end)), ...tail]);
}

/** Whole lines only; `lenient` returns nothing for text that is not one valid line (a torn tail). */
function parseResults(path: string, bytes: Buffer, lenient = false): Map<string, ResultLine> {
  const finished = new Map<string, ResultLine>();
  for (const [i, line] of bytes.toString("utf8").split("\n").entries()) {
    if (!line.trim()) continue;
    let parsed: ResultLine;
    try {
      parsed = parseStateValue(ResultLineSchema, line, `${path}:${i + 1}`);
    } catch (error) {
      if (lenient) return new Map();
      throw error;
    }
    finished.set(parsed.rollout_id, parsed);
  }
  return finished;
}

async function readIfExists(path: string): Promise<Buffer | undefined> {
  try {
    return await readFile(path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
    throw error;
  }
}
