/** The wire contract of gym-ckpt: schemas, ids, subjects, error catalog. No I/O. */
export { PROTOCOL_VERSION, MANIFEST_SCHEMA_VERSION, MAX_CONTROL_MESSAGE_BYTES } from "./version.js";
export {
  SAFE_NAME_PATTERN,
  MAX_ATTEMPT,
  RolloutIdSchema,
  AttemptSchema,
  EpisodeIdSchema,
  CheckpointIdSchema,
  InstanceSchema,
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
  CheckpointError,
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
  MemberSchema,
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
  RECORDS_FILE_PATTERN,
  MANIFEST_FILE,
  GLOBAL_MANIFEST_FILE,
  LATEST_FILE,
  ParticipantManifestSchema,
  RecordBaseSchema,
  ParticipantEntrySchema,
  ControllerStateSchema,
  GlobalManifestSchema,
} from "./manifest.js";
export type { ParticipantManifest, RecordBase, ParticipantEntry, ControllerState, GlobalManifest } from "./manifest.js";
export {
  participantSubject,
  controllerSubject,
  membersBucket,
  leaderBucket,
  journalBucket,
  memberKey,
  HEADER_AUTHORIZATION,
  MEMBER_TTL_MS,
  MEMBER_HEARTBEAT_MS,
  HEADER_TRACEPARENT,
  HEADER_TRACESTATE,
} from "./subjects.js";
export { canonicalJson, canonicalDigest, sha256Hex } from "./canonical-json.js";
export { decodeMessage, encodeMessage } from "./codec.js";
export { tokensEqual, bearerToken } from "./auth.js";
