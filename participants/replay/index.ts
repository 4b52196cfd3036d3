/** Replay of saved rollouts: record writer, byte-span index, record reader and replay task source. */
export { ReplayError, type ReplayErrorCode } from "./errors.js";
export {
  ContentSchema,
  ToolCallSchema,
  MessageSchema,
  MessageNodeSchema,
  PromptSchema,
  RecordTaskSchema,
  TraceRecordSchema,
} from "./trace-record.js";
export type { Content, ToolCall, Message, MessageNode, Prompt, RecordTask, TraceRecord } from "./trace-record.js";
export { leaves, branches, branchCount, turnCount, traceReward, snapshotRefs } from "./trace-graph.js";
export {
  RECORD_KINDS,
  ENV_NAME_PATTERN,
  stepDirName,
  recordFileName,
  parseRecordFileName,
  indexPathFor,
  isIndexFileName,
  stepOfPath,
} from "./record-paths.js";
export type { RecordKind } from "./record-paths.js";
export { expandGlobs, naturalCompare } from "./record-glob.js";
export { writeFileAtomic } from "../storage/fs-durable.js";
export { INDEX_FORMAT, INDEX_VERSION, IndexHeaderSchema, IndexRowSchema, encodeIndex, checkIndex } from "./rollout-index.js";
export type { IndexHeader, IndexRow, IndexExpectation, IndexCheck } from "./rollout-index.js";
export { StepMarkerSchema, stepMarkerName, isStepMarkerName, completedFiles } from "./step-marker.js";
export type { StepMarker } from "./step-marker.js";
export { encodeRecords, writeRolloutRecords, writeStepRecords, RecordWriter } from "./record-writer.js";
export type { EnvRecords, WrittenRecords } from "./record-writer.js";
export {
  REPLAY_NAME_PREFIXES,
  selectionSkip,
  recordSkip,
  newReadStats,
  addReadStats,
  readRecords,
  maxIndexBytes,
} from "./record-reader.js";
export type { RecordFilters, SkipReason, ReadStats, LoadedRecord, ReadOptions } from "./record-reader.js";
export { seededRandom, sampleSorted } from "./seeded-random.js";
export type { Random, RandomFactory } from "./seeded-random.js";
export { estimateTokens, compactionSeeds, toolCallSeeds, recheckSeed, seededContextNodes, isResumePoint } from "./anchors.js";
export type { AnchorKind, Seed, ToolCallOptions } from "./anchors.js";
export {
  DEFAULT_RECHECK_PROMPT,
  ReplayConfigSchema,
  parseReplayConfig,
  dumpReplayConfig,
  recordPatterns,
  recordFilters,
} from "./replay-config.js";
export type { ReplayConfig, ReplayConfigInput } from "./replay-config.js";
export { MAX_RETAINED_RELOAD_BYTES, ReplayTaskSource } from "./replay-task-source.js";
export type {
  TaskShape,
  SourceEnvironment,
  ReplayLineage,
  ReplayTask,
  ReplaySkipReason,
  ReplayStats,
  ReloadResult,
  ReplayTaskSourceOptions,
} from "./replay-task-source.js";
export {
  ChatToolCallSchema,
  ChatMessageLikeSchema,
  chatToMessage,
  messageToChat,
  promptToChat,
  nodesFromChat,
  chatTrajectory,
} from "./chat-trajectory.js";
export type { ChatMessageLike } from "./chat-trajectory.js";
export { replayTaskId } from "./replay-task-id.js";
export { GYM_SOURCE_ID, GymRecordTaskSchema, gymSourceEnvironment, loadGymReplaySource, gymReplayRun } from "./gym-replay-source.js";
export type { GymRecordTask, GymReplaySource, GymReplayRun } from "./gym-replay-source.js";
export { CheckpointSeedSchema, exportCheckpointSeeds } from "./checkpoint-seeds.js";
export type { CheckpointSeed, CheckpointSeedSkip, CheckpointSeedExport } from "./checkpoint-seeds.js";
