import { appendFile, readFile } from "node:fs/promises";
import { z } from "zod";
import { EpisodeIdSchema, RolloutIdSchema, type EpisodeId } from "../../protocol/index.js";
import { replaceFileDurably } from "../publication/durable-fs.js";

/**
 * `dispatched.jsonl`: the run id on the first line, then one `{rollout_id, attempt}` line appended
 * just before each `/run` is sent. After a crash it names every attempt that may still be running
 * somewhere, so the next run can retire them before sending replacements. Lines are flushed, not
 * fsynced: losing the tail on power loss only loses attempts that never reached a server.
 */
const HeaderSchema = z.object({ run_id: z.string().min(1).max(128) }).strict();
const EntrySchema = EpisodeIdSchema;

export interface DispatchHistory {
  runId: string;
  /** Latest logged attempt per rollout. */
  latest: Map<string, number>;
}

export class DispatchLog {
  private constructor(
    readonly path: string,
    readonly runId: string,
  ) {}

  /** Starts a fresh log for a new run, carrying forward attempts that must stay fenced. */
  static async create(path: string, runId: string, carried: Iterable<EpisodeId> = []): Promise<DispatchLog> {
    const lines = [JSON.stringify({ run_id: runId }), ...[...carried].map((e) => JSON.stringify(EntrySchema.parse(e)))];
    // Atomic: a crash mid-rewrite must not lose the carried attempts (they would be re-sent as
    // attempt 0, reusing capture keys); the old log stays until the new one is whole.
    await replaceFileDurably(path, `${lines.join("\n")}\n`);
    return new DispatchLog(path, runId);
  }

  async record(episode: EpisodeId): Promise<void> {
    await appendFile(this.path, `${JSON.stringify({ rollout_id: episode.rollout_id, attempt: episode.attempt })}\n`);
  }

  /** Reads a previous run's log; a torn (unparseable) last line is ignored, any other bad line is an error. */
  static async read(path: string): Promise<DispatchHistory | undefined> {
    let text: string;
    try {
      text = await readFile(path, "utf8");
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") return undefined;
      throw error;
    }
    // The piece after the last newline is either empty or a torn append: drop it.
    const complete = text.split("\n").slice(0, -1);
    if (complete.length === 0) return undefined;
    const header = HeaderSchema.parse(JSON.parse(complete[0]!));
    const latest = new Map<string, number>();
    for (const line of complete.slice(1)) {
      if (!line.trim()) continue;
      const entry = EntrySchema.parse(JSON.parse(line));
      RolloutIdSchema.parse(entry.rollout_id);
      latest.set(entry.rollout_id, Math.max(latest.get(entry.rollout_id) ?? 0, entry.attempt));
    }
    return { runId: header.run_id, latest };
  }
}
