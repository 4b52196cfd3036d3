import { appendFile, open, readFile } from "node:fs/promises";
import { z } from "zod";
import { EpisodeIdSchema } from "../../protocol/index.js";

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

export async function appendResult(path: string, line: ResultLine): Promise<void> {
  await appendFile(path, `${JSON.stringify(ResultLineSchema.parse(line))}\n`);
}

/** Finished rows by rollout id; a torn last line (crash mid-append) is ignored. */
export async function readResults(path: string): Promise<Map<string, ResultLine>> {
  const finished = new Map<string, ResultLine>();
  let text: string;
  try {
    text = await readFile(path, "utf8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return finished;
    throw error;
  }
  // The piece after the last newline is either empty or a torn append: drop it.
  for (const line of text.split("\n").slice(0, -1)) {
    if (!line.trim()) continue;
    const parsed = ResultLineSchema.parse(JSON.parse(line));
    finished.set(parsed.rollout_id, parsed);
  }
  return finished;
}

/**
 * Start-up repair of a crash mid-append: the torn last line is cut off, or, when it is a whole
 * record that only lost its newline, the newline is added. Otherwise the next append would land
 * after the fragment, leaving it mid-file where `readResults` refuses it.
 */
export async function repairResultsTail(path: string): Promise<void> {
  let bytes: Buffer;
  try {
    bytes = await readFile(path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") return;
    throw error;
  }
  const end = bytes.lastIndexOf(0x0a) + 1;
  if (end === bytes.length) return;
  const handle = await open(path, "r+");
  try {
    if (isResultLine(bytes.subarray(end).toString("utf8"))) await handle.write("\n", bytes.length);
    else await handle.truncate(end);
    await handle.sync();
  } finally {
    await handle.close();
  }
}

function isResultLine(text: string): boolean {
  try {
    return ResultLineSchema.safeParse(JSON.parse(text)).success;
  } catch {
    return false;
  }
}
