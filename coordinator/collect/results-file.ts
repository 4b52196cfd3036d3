import { appendFile, readFile } from "node:fs/promises";
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
