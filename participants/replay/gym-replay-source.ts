import path from "node:path";
import type { Logger } from "pino";
import { z } from "zod";
import { CheckpointError, duplicateJsonKey, isUnreadableStorage, namePath } from "../../protocol/index.js";
import { GymTaskSchema, type GymTask } from "../gym/agent-server/gym-task.js";
import { readRegularFileSync } from "../storage/regular-file.js";
import { promptToChat, type ChatMessageLike } from "./chat-trajectory.js";
import { invalidRequest } from "./errors.js";
import { MAX_REPLAY_CONFIG_BYTES, parseReplayConfig, type ReplayConfig } from "./replay-config.js";
import { ReplayTaskSource, sourceConfigFor, type ReplayTask, type SourceEnvironment } from "./replay-task-source.js";
import { replayTaskId } from "./replay-task-id.js";
import { PromptSchema } from "./trace-record.js";

/**
 * The reference Gym as a replay source: its records carry the Gym task (expression, tool_rounds)
 * next to idx/name/prompt. Scoring stays with the resources server's `/verify`, which the
 * environment server calls for every `/run`, replayed or not.
 */
export const GYM_SOURCE_ID = "reference-gym";

export const GymRecordTaskSchema = GymTaskSchema.extend({
  idx: z.number().int(),
  name: z.string().nullable(),
  prompt: PromptSchema.nullable(),
}).strict();
export type GymRecordTask = z.infer<typeof GymRecordTaskSchema>;

export const gymSourceEnvironment: SourceEnvironment<GymRecordTask, { reward: number }, number> = {
  id: GYM_SOURCE_ID,
  taskSchema: GymRecordTaskSchema,
  configSchema: z.object({ id: z.literal(GYM_SOURCE_ID) }).strict(),
  tools: ["calculator"],
  // The environment server verifies through the resources server; a rollout reply already holds it.
  score: (_task, rollout) => rollout.reward,
};

export type GymReplaySource = ReplayTaskSource<GymRecordTask, { reward: number }, number>;

/** A replay config file read and checked; relative record globs resolve against `cwd`, its directory. */
export interface GymReplayConfig {
  config: ReplayConfig;
  cwd: string;
}

/**
 * Reads and checks a replay config file for the reference Gym, reading no record: synchronous, so
 * the environment server checks `--replay-config` with its other flags, before NATS. A config it
 * cannot use (missing, not a regular file, over MAX_REPLAY_CONFIG_BYTES, not JSON, invalid, for
 * another source) is invalid_request; one the storage refuses to read (EACCES, EIO) is thrown as it is.
 */
export function readGymReplayConfig(configPath: string): GymReplayConfig {
  let text: string;
  try {
    // Only a regular file within the limit is read: a FIFO or a device would block or exhaust the
    // start-up (opened non-blocking, so a FIFO answers at once).
    text = readRegularFileSync(configPath, { maxBytes: MAX_REPLAY_CONFIG_BYTES }).toString("utf8");
  } catch (error) {
    if (error instanceof CheckpointError) throw invalidRequest(`replay config ${error.message}`);
    // The storage refusing the read (EACCES, EIO, a stale mount) is no bad flag: thrown as it is,
    // storage_error, for the caller to report (exit 1, which a supervisor retries).
    if (isUnreadableStorage(error)) throw namePath(error, configPath);
    throw invalidRequest(`replay config ${configPath} is not readable: ${error instanceof Error ? error.message : String(error)}`);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text);
  } catch {
    // Not JSON.parse's message: it quotes the text, newlines included, and the refusal is one line.
    throw invalidRequest(`replay config ${configPath} is not valid JSON`);
  }
  // JSON.parse keeps the last of a key named twice: an edited mode or glob would be ignored without a word.
  const twice = duplicateJsonKey(text);
  if (twice !== undefined) throw invalidRequest(`replay config ${configPath} names the key ${JSON.stringify(twice)} twice in one object`);
  const config = parseReplayConfig(raw);
  sourceConfigFor(config, gymSourceEnvironment);
  return { config, cwd: path.dirname(path.resolve(configPath)) };
}

/** Builds and loads the source of a replay config file (a path, or what readGymReplayConfig read). */
export async function loadGymReplaySource(configFile: string | GymReplayConfig, logger?: Logger): Promise<GymReplaySource> {
  const { config, cwd } = typeof configFile === "string" ? readGymReplayConfig(configFile) : configFile;
  const source = new ReplayTaskSource(config, gymSourceEnvironment, { cwd, ...(logger && { logger }) });
  await source.load();
  return source;
}

/** What `/run` needs to run a replayed task: the Gym task and the context the agent continues from. */
export interface GymReplayRun {
  replay_idx: number;
  /** The task's content id (`replayTaskId`): `/run` refuses a `replay_idx` whose task has another. */
  replay_id: string;
  name: string;
  task: GymTask;
  seed: ChatMessageLike[];
  lineage: ReplayTask["lineage"];
}

export function gymReplayRun(task: ReplayTask<GymRecordTask>): GymReplayRun {
  const { expression, tool_rounds } = task.task;
  return { replay_idx: task.idx, replay_id: replayTaskId(task), name: task.name, task: { expression, tool_rounds }, seed: promptToChat(task.prompt), lineage: task.lineage };
}
