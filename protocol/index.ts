/** The wire contract of gym-ckpt: schemas, ids, subjects, error catalog; no I/O but `makeDirectories`, shared by both sides. */
export { PACKAGE_VERSION, PROTOCOL_VERSION, MANIFEST_SCHEMA_VERSION, protocolVersionMismatch, MAX_CONTROL_MESSAGE_BYTES, MAX_DEADLINE_AHEAD_S, MAX_TIMER_MS, timerDelay } from "./version.js";
export { DURATION_BUCKETS_S } from "./duration-buckets.js";
export { LOG_REDACT_PATHS, LOG_REDACT_CENSOR } from "./log-redaction.js";
export { loggedError } from "./logged-error.js";
export { FailureSpellLog, type SpellLogger } from "./failure-spell-log.js";
export { endLogsWhenStdoutRefuses } from "./stdout-log-refusal.js";
export { dieByHangup } from "./die-by-hangup.js";
export { makeDirectories, isMisplacedDirectory, parentsOfCreated } from "./make-directories.js";
export { envSetting } from "./env-setting.js";
export { finishedWithin, within, type SetTimer } from "./within.js";
export { timeoutSignal } from "./timeout-signal.js";
export { equalJitter, type RandomSource } from "./jitter.js";
export { isHttpUrl, redactUrl } from "./http-url.js";
export { refuseMalformedHttpRequest, refuseUnknownExpectations } from "./malformed-http-request.js";
export { decodedHeaders } from "./message-headers.js";
export { HEADER_SENT_AT, formatSentAt, parseSentAt } from "./sent-at-header.js";
export { HEADER_COORDINATOR_EPOCH, HEADER_COORDINATOR_ID, HEADER_COORDINATOR_SERVED, formatCoordinatorIdHeader, parseCoordinatorEpochHeader, parseCoordinatorIdHeader } from "./readyz-headers.js";
export { isStorageFailure, isUnreadableStorage, namePath } from "./storage-failure.js";
export { LineSplitter, textLines, type SplitLine } from "./line-splitter.js";
export { taskOfLine, taskRowOf } from "./task-line.js";
export {
  SAFE_NAME_PATTERN,
  SUBJECT_SAFE_NAME_PATTERN,
  MAX_ATTEMPT,
  MAX_ROLLOUT_ID_CHARS,
  RolloutIdSchema,
  AttemptSchema,
  EpisodeIdSchema,
  commitScopeIssue,
  restoreScopeIssue,
  rolloutAtTwoAttempts,
  restoreScopeSchema,
  CheckpointIdSchema,
  MAX_CHECKPOINT_ID_CHARS,
  InstanceSchema,
  MAX_INSTANCE_CHARS,
  DeploymentSchema,
  CaptureKeySchema,
  captureKey,
  parseCaptureKey,
  nextAttempt,
  sameEpisode,
} from "./ids.js";
export type { RolloutId, EpisodeId, CheckpointId, Instance } from "./ids.js";
export { KINDS, KindSchema, PREPARE_STAGES, RESUME_STAGES, RETIRE_STAGES } from "./kinds.js";
export type { Kind } from "./kinds.js";
export {
  ERROR_CATALOG,
  ERROR_CODES,
  ErrorCodeSchema,
  ErrorReplySchema,
  foreignRefusal,
  CheckpointError,
  RESTORE_REFUSALS,
  toCheckpointError,
  describeZodError,
} from "./errors.js";
export type { ErrorCode, ErrorReply } from "./errors.js";
export {
  OPS,
  OpSchema,
  PHASES,
  PhaseSchema,
  MAX_BLOCKERS,
  CheckpointDirSchema,
  StatusRequestSchema,
  PrepareRequestSchema,
  RenewRequestSchema,
  ResumeRequestSchema,
  CommitRequestSchema,
  RestoreRequestSchema,
  RetireRequestSchema,
  ForgetRequestSchema,
  PrepareReportSchema,
  StatusReplySchema,
  PrepareReplySchema,
  RenewReplySchema,
  CommitReplySchema,
  RestoreReplySchema,
  ResumeReplySchema,
  RetireReplySchema,
  ForgetReplySchema,
  CONTROL_MESSAGES,
  GUARDED_OPS,
  IncarnationSchema,
  MAX_INCARNATION_CHARS,
  MAX_CHECKPOINT_DIR_CHARS,
  MemberSchema,
  outsideCheckpointId,
  namesCheckpoint,
} from "./messages.js";
export type {
  Op,
  PhaseOp,
  Phase,
  PrepareReport,
  StatusRequest,
  PrepareRequest,
  RenewRequest,
  ResumeRequest,
  CommitRequest,
  CommitRequestInput,
  RestoreRequest,
  RetireRequest,
  ForgetRequest,
  StatusReply,
  PrepareReply,
  RenewReply,
  CommitReply,
  RestoreReply,
  ResumeReply,
  RetireReply,
  ForgetReply,
  RequestOf,
  RequestInputOf,
  ReplyOf,
  Member,
} from "./messages.js";
export {
  PARTICIPANTS_DIR,
  RECORDS_FILE_PATTERN,
  MANIFEST_FILE,
  GLOBAL_MANIFEST_FILE,
  LATEST_FILE,
  ROOT_DEPLOYMENT_FILE,
  MAX_ROOT_DEPLOYMENT_BYTES,
  RootDeploymentSchema,
  MAX_MANIFEST_BYTES,
  MAX_GLOBAL_MANIFEST_BYTES,
  MAX_CONTROLLER_STATE_FILE_BYTES,
  MAX_GLOBAL_MANIFEST_NESTING,
  ParticipantManifestSchema,
  RecordBaseSchema,
  ParticipantEntrySchema,
  ControllerStateSchema,
  GlobalManifestSchema,
  schemaVersionMismatch,
} from "./manifest.js";
export type { ParticipantManifest, RecordBase, ParticipantEntry, ControllerState, GlobalManifest, RootDeployment } from "./manifest.js";
export {
  participantSubject,
  controllerSubject,
  membersBucket,
  leaderBucket,
  journalBucket,
  memberKey,
  participantOfMemberKey,
  HEADER_AUTHORIZATION,
  MEMBER_TTL_MS,
  MEMBER_HEARTBEAT_MS,
  HEADER_TRACEPARENT,
  HEADER_TRACESTATE,
} from "./subjects.js";
export { awaitBucketStore, isNoResponders, BUCKET_STORE_WAIT_MS, type BucketStore } from "./kv-store-ready.js";
export { LEADER_KEY, MIN_LEASE_MS, decodeLeaseValue, encodeLeaseValue, isPassableEpoch, leaderOfOtherVersion, leaseEpochFloor, leaseIssuedEpoch, type LeaseHolder, type LeaseValue } from "./leader-lease.js";
export { canonicalJson, canonicalDigest, sha256Hex } from "./canonical-json.js";
export { jsonTextWithin } from "./json-too-long.js";
export { MAX_JSON_DEPTH, jsonNestsDeeperThan } from "./json-depth.js";
export { JsonObjectSchema, JsonValueSchema, isPlainObject, keepingProtoKey, setOwnProperty, type JsonValue } from "./json-value.js";
export { duplicateJsonKey } from "./json-duplicate-keys.js";
export { unsafeJsonInteger } from "./json-unsafe-integer.js";
export { decodeMessage, decodeRequest, encodeMessage, encodeReply, parseName } from "./codec.js";
export { tokensEqual, bearerToken, BearerTokenSchema } from "./auth.js";
export { ROLLOUT_PREFIX, parseRolloutPath, rolloutPath } from "./rollout-path.js";
export type { RolloutPath } from "./rollout-path.js";
export {
  CONTROLLER_OPS,
  CONTROLLER_OP_NAMES,
  ControllerStateInputSchema,
  CtlPrepareRequestSchema,
  MAX_SCOPE,
  CtlCommitRequestSchema,
  CtlPublishRequestSchema,
  CtlResumeRequestSchema,
  CtlRenewRequestSchema,
  CtlCheckpointRequestSchema,
  CtlRestoreRequestSchema,
  CtlRetireRequestSchema,
  CtlForgetRequestSchema,
  CtlStatusRequestSchema,
  CtlListRequestSchema,
  CtlGetRequestSchema,
  CtlPrepareParticipantSchema,
  CtlBlockerSchema,
  CtlPrepareReplySchema,
  CtlCommitReplySchema,
  CtlPublishReplySchema,
  CtlResumeReplySchema,
  CtlRenewReplySchema,
  CtlCheckpointReplySchema,
  CtlRestoreReplySchema,
  CtlRetireReplySchema,
  CtlForgetReplySchema,
  CtlParticipantStatusSchema,
  CtlStatusReplySchema,
  CtlListReplySchema,
  CtlGetReplySchema,
} from "./controller-api.js";
export type { ControllerOp, ControllerStateInput, CtlDamagedCheckpoint, CtlLatestError, CtlRequestOf, CtlRequestInputOf, CtlReplyOf } from "./controller-api.js";
export { CONTROLLER_OP_REFUSALS, EVERY_OP_REFUSALS, NATS_ONLY_REFUSALS, PARTICIPANT_REFUSALS, controllerOpRefusals } from "./controller-refusals.js";
export type { OpRefusals, ParticipantRefusals } from "./controller-refusals.js";
export {
  TraceContentSchema,
  TraceToolCallSchema,
  TraceMessageSchema,
  TraceNodeSchema,
  TracePromptSchema,
  TraceTaskSchema,
  TraceRecordSchema,
  traceLeaves,
  traceBranchCount,
  traceTurnCount,
  traceReward,
  ROLLOUTS_DIR,
  RECORD_KINDS,
  RecordKindSchema,
  ROLLOUT_ENV_PATTERN,
  MAX_ROLLOUT_ENV_LENGTH,
  assertRolloutEnv,
  assertRolloutStep,
  rolloutStepDir,
  rolloutRecordFileName,
  rolloutIndexFileName,
  parseRolloutRecordFileName,
  rolloutRecordPaths,
  ROLLOUT_INDEX_FORMAT,
  ROLLOUT_INDEX_VERSION,
  RolloutIndexHeaderSchema,
  RolloutIndexRowSchema,
  encodeRolloutIndex,
  encodeRecordLines,
  MAX_ROLLOUT_BATCH_BYTES,
  rolloutBatchFit,
  RolloutStepMarkerSchema,
  rolloutStepMarkerName,
  encodeRolloutStepMarker,
  MAX_ROLLOUT_STEP_MARKER_BYTES,
  rolloutStepMarkerFiles,
  stepMarkerComplete,
  encodeRolloutRecords,
  RunTrajectorySchema,
  TRAJECTORY_HEADER,
  traceRecordFromTrajectory,
  traceSnapshotRefs,
  MAX_RECORD_NESTING,
} from "./rollout-records.js";
export type {
  TraceContent,
  TraceToolCall,
  TraceMessage,
  TraceNode,
  TracePrompt,
  TraceTask,
  TraceRecord,
  RecordKind,
  RolloutIndexHeader,
  RolloutIndexRow,
  RolloutStepMarker,
  RolloutRecordBatch,
  EncodedRolloutRecords,
  RunTrajectory,
} from "./rollout-records.js";
import "./nats-write-after-end.js";
export { DEFAULT_NATS_URL, isWrongRevision, kvReplicas, DEFAULT_NATS_CONNECT_TIMEOUT_MS, MAX_NATS_CONNECT_TIMEOUT_MS, natsConnectTimeoutMs, NATS_INBOX_PREFIXES, NATS_OP_REPLY_PREFIX, NATS_PING_OPTIONS, natsServers, natsSettings, redactNatsServers, type NatsRole, type NatsServerInfo } from "./nats-connection.js";
export type { NatsConnectionSettings } from "./nats-connection.js";
export { connectNats, connectNatsWithin, DEFAULT_NATS_CONNECT_WAIT_MS, MAX_NATS_CONNECT_WAIT_MS, type FirstConnectFailure } from "./nats-first-connect.js";
