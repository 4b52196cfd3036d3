import { z } from "zod";
import { ErrorCodeSchema } from "./errors.js";
import { CheckpointIdSchema, EpisodeIdSchema, InstanceSchema, RolloutIdSchema, commitScopeSchema, restoreScopeSchema, anyCase } from "./ids.js";
import { KindSchema } from "./kinds.js";
import { MAX_JSON_DEPTH } from "./json-depth.js";
import { JsonObjectSchema, JsonValueSchema } from "./json-value.js";
import { GLOBAL_MANIFEST_FILE, GlobalManifestSchema, ParticipantEntrySchema, Sha256Schema } from "./manifest.js";
import { PhaseSchema, PrepareReportSchema } from "./messages.js";
import { MAX_DEADLINE_AHEAD_S } from "./version.js";

/**
 * The controller API of the active coordinator: one request and one reply schema per op, shared by
 * the NATS API (`controllerSubject(deployment, op)`), the HTTP API (one route per op) and the
 * typed clients. Every request is strict; refusals are `ErrorReplySchema` bodies with catalog codes.
 */

/** The most episodes (or rollouts) one controller request names. */
export const MAX_SCOPE = 100_000;

/** Absolute deadline, Unix epoch seconds; the coordinator's default timeout applies when omitted. */
const OptionalDeadline = z
  .number()
  .finite()
  .positive()
  // The cap is relative to the coordinator's clock, so no `maximum` can state it: described instead.
  .meta({
    description: `Absolute deadline in Unix seconds (not milliseconds), at most ${MAX_DEADLINE_AHEAD_S} s (7 days) ahead of the coordinator's clock, else invalid_request; one already past is deadline_exceeded. Omitted: the coordinator's default timeout.`,
  })
  .optional();

/** The controller's own state: inline JSON, or a file it already wrote into the checkpoint directory. */
export const ControllerStateInputSchema = z
  .union([
    z.object({ inline: z.unknown().meta({ description: "Any JSON value; every number finite (1e400 is refused, not stored as null)." }) }).strict(),
    z
      .object({
        file: z
          .string()
          .min(1)
          .max(255)
          .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, "file must be a plain file name")
          // Publication writes checkpoint.json into the same directory: it would overwrite the state (any case, for case-insensitive filesystems).
          .refine((file) => file.toLowerCase() !== GLOBAL_MANIFEST_FILE, `file may not be ${GLOBAL_MANIFEST_FILE} (publication writes it)`)
          .meta({ not: { pattern: `^${anyCase(GLOBAL_MANIFEST_FILE)}$` } }),
        /** When given, the coordinator checks the file against it. */
        sha256: Sha256Schema.optional(),
      })
      .strict(),
  ])
  // Checked after the union, so the detail names `inline`. JSON.parse reads 1e400 as Infinity,
  // which checkpoint.json (JSON.stringify) would hold as null: refused instead of changed.
  .superRefine((state, ctx) => {
    if ("inline" in state && !JsonValueSchema.safeParse(state.inline).success) {
      ctx.addIssue({ code: "custom", path: ["inline"], message: `must be a JSON value with finite numbers only (1e400 reads as Infinity, which JSON would store as null), nested at most ${MAX_JSON_DEPTH} levels deep` });
    }
  });
export type ControllerStateInput = z.infer<typeof ControllerStateInputSchema>;

const ParticipantRef = { kind: KindSchema, instance: InstanceSchema };
/** A catalog code and its detail, in a reply that still answers: a participant's error, why `list` names no LATEST. */
const RefusalDetailSchema = z.object({ code: ErrorCodeSchema, detail: z.string() }).strict();

/*
 * Reply size (docs/api.md): over NATS a reply must fit one message (1 MiB), so past that the
 * coordinator leaves lists out of it, largest first. A left-out list is null, with its length in
 * `<name>_count` and the sha256 of its canonical JSON in `<name>_sha256` beside it (both absent
 * while the list is there); samples (`blockers`) are emptied and error details cut instead, their
 * counts staying. The HTTP API answers in full.
 */
const LeftOutCount = z.number().int().min(0).optional();
const LeftOutSha256 = Sha256Schema.optional();
const StringListOrLeftOut = z.array(z.string()).nullable();

/** A participant's entry in the commit reply and in `get`'s manifest: checkpoint.json's, lists possibly left out. */
export const CtlParticipantEntrySchema = ParticipantEntrySchema.extend({
  /** Capture keys the participant exported, sorted; null = left out (read them from its committed records). */
  episode_ids: StringListOrLeftOut,
  episode_count: LeftOutCount,
  episode_ids_sha256: LeftOutSha256,
  extras: JsonObjectSchema.nullable(),
  extras_sha256: LeftOutSha256,
}).strict();

/** checkpoint.json as `get` answers it: participants' lists, the scope and the restarts possibly left out. */
export const CtlGlobalManifestSchema = GlobalManifestSchema.extend({
  /** null with `scope_count` = left out; null without it = everything each participant held. */
  scope_count: LeftOutCount,
  scope_sha256: LeftOutSha256,
  restarts: StringListOrLeftOut,
  restart_count: LeftOutCount,
  restarts_sha256: LeftOutSha256,
  participants: z.array(CtlParticipantEntrySchema),
}).strict();

/** A participant's prepare report; its restarts possibly left out. */
export const CtlPrepareReportSchema = PrepareReportSchema.extend({
  restarts: StringListOrLeftOut,
  restart_count: LeftOutCount,
  restarts_sha256: LeftOutSha256,
}).strict();

// ---- requests ------------------------------------------------------------------------------

export const CtlPrepareRequestSchema = z.object({ checkpoint_id: CheckpointIdSchema, deadline_ts: OptionalDeadline }).strict();
export const CtlCommitRequestSchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    deadline_ts: OptionalDeadline,
    /** The episodes the controller continues; null = everything each participant holds. */
    episode_ids: commitScopeSchema(MAX_SCOPE),
    stop: z.boolean().default(false),
  })
  .strict();
export const CtlPublishRequestSchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    controller_state: ControllerStateInputSchema.nullable().default(null),
  })
  .strict();
export const CtlResumeRequestSchema = z.object({ checkpoint_id: CheckpointIdSchema, deadline_ts: OptionalDeadline }).strict();
export const CtlRenewRequestSchema = z.object({ checkpoint_id: CheckpointIdSchema, deadline_ts: OptionalDeadline }).strict();
export const CtlCheckpointRequestSchema = z
  .object({
    /** Generated (time-ordered) when omitted. */
    checkpoint_id: CheckpointIdSchema.optional(),
    deadline_ts: OptionalDeadline,
    episode_ids: commitScopeSchema(MAX_SCOPE),
    stop: z.boolean().default(false),
    controller_state: ControllerStateInputSchema.nullable().default(null),
  })
  .strict();
export const CtlRestoreRequestSchema = z
  .object({
    /** The published checkpoint to restore; LATEST when omitted. */
    checkpoint_id: CheckpointIdSchema.optional(),
    deadline_ts: OptionalDeadline,
    /** The checkpointed (source) attempts the controller will continue, one attempt per rollout. */
    episode_ids: restoreScopeSchema(MAX_SCOPE),
  })
  .strict();
export const CtlRetireRequestSchema = z
  .object({
    /** Defaults to the restored checkpoint's id, or "retire". */
    checkpoint_id: CheckpointIdSchema.optional(),
    deadline_ts: OptionalDeadline,
    episode_ids: z.array(EpisodeIdSchema).min(1).max(MAX_SCOPE),
  })
  .strict();
export const CtlForgetRequestSchema = z
  .object({
    checkpoint_id: CheckpointIdSchema.optional(),
    deadline_ts: OptionalDeadline,
    rollout_ids: z.array(RolloutIdSchema).min(1).max(MAX_SCOPE),
  })
  .strict();
export const CtlStatusRequestSchema = z.object({}).strict();
export const CtlListRequestSchema = z.object({}).strict();
export const CtlGetRequestSchema = z.object({ checkpoint_id: CheckpointIdSchema }).strict();

// ---- replies -------------------------------------------------------------------------------

export const CtlPrepareParticipantSchema = z
  .object({
    ...ParticipantRef,
    ok: z.boolean(),
    phase: z.enum(["prepared", "preparing", "idle"]).nullable(),
    report: CtlPrepareReportSchema.nullable(),
    error: RefusalDetailSchema.nullable(),
  })
  .strict();
export const CtlBlockerSchema = z
  .object({
    ...ParticipantRef,
    /** Capture keys or synthetic labels; for a failed request, the error code. */
    blockers: z.array(z.string()),
    blocker_count: z.number().int().min(0),
    code: ErrorCodeSchema.nullable(),
  })
  .strict();
export const CtlPrepareReplySchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    epoch: z.number().int().min(0),
    prepared: z.boolean(),
    /** The stage that was not fully prepared, or null. */
    stopped_at: KindSchema.array().nullable(),
    participants: z.array(CtlPrepareParticipantSchema),
    blockers: z.array(CtlBlockerSchema),
    restarts: z.array(z.string()),
  })
  .strict();
export const CtlCommitReplySchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    epoch: z.number().int().min(0),
    checkpoint_dir: z.string(),
    participants: z.array(CtlParticipantEntrySchema),
  })
  .strict();
export const CtlPublishReplySchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    manifest_path: z.string(),
    published_at: z.number(),
    /** Checkpoint ids removed by retention (old published ones and partial ones). */
    deleted: z.array(z.string()),
  })
  .strict();
export const CtlResumeReplySchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    participants: z.array(z.object({ ...ParticipantRef, idempotent: z.boolean() }).strict()),
  })
  .strict();
export const CtlRenewReplySchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    participants: z.array(z.object({ ...ParticipantRef, lease_expires_at: z.number() }).strict()),
  })
  .strict();
export const CtlCheckpointReplySchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    epoch: z.number().int().min(0),
    checkpoint_dir: z.string(),
    manifest_path: z.string(),
    published_at: z.number(),
    participants: z.number().int().min(0),
    restarts: StringListOrLeftOut,
    restart_count: LeftOutCount,
    restarts_sha256: LeftOutSha256,
    deleted: z.array(z.string()),
    /** Participants that failed to resume (it ran beside the publication; each resumes when its lease expires). */
    resume_failures: z.array(z.object({ ...ParticipantRef, ...RefusalDetailSchema.shape }).strict()),
    timings_ms: z.object({ prepare: z.number(), commit: z.number(), publish: z.number(), resume: z.number() }).strict(),
  })
  .strict();
export const CtlRestoreReplySchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    participants: z.array(z.object({ ...ParticipantRef, restored: StringListOrLeftOut, restored_count: LeftOutCount, restored_sha256: LeftOutSha256 }).strict()),
  })
  .strict();
export const CtlRetireReplySchema = z
  .object({ participants: z.array(z.object({ ...ParticipantRef, retired: StringListOrLeftOut, retired_count: LeftOutCount, retired_sha256: LeftOutSha256 }).strict()) })
  .strict();
export const CtlForgetReplySchema = z
  .object({ participants: z.array(z.object({ ...ParticipantRef, forgotten: StringListOrLeftOut, forgotten_count: LeftOutCount, forgotten_sha256: LeftOutSha256 }).strict()) })
  .strict();
export const CtlParticipantStatusSchema = z
  .object({
    ...ParticipantRef,
    reachable: z.boolean(),
    phase: PhaseSchema.nullable(),
    checkpoint_id: CheckpointIdSchema.nullable(),
    lease_expires_at: z.number().nullable(),
    epoch: z.number().int().min(0).nullable(),
    blockers: z.array(z.string()),
    blocker_count: z.number().int().min(0),
    error: RefusalDetailSchema.nullable(),
  })
  .strict();
export const CtlStatusReplySchema = z
  .object({
    deployment: z.string(),
    coordinator: z.object({ id: z.string(), leader: z.boolean(), ready: z.boolean(), epoch: z.number().int().nullable() }).strict(),
    checkpoint: z.object({ checkpoint_id: CheckpointIdSchema, phase: z.string(), epoch: z.number().int() }).strict().nullable(),
    participants: z.array(CtlParticipantStatusSchema),
  })
  .strict();
/**
 * Why `list` (and `gym-ckpt ls --json`) names no LATEST though one is there: LATEST cannot be read,
 * or names a checkpoint the listing lacks (its checkpoint.json damaged or gone). The listing is
 * still answered: that is when a controller lists the checkpoints, to pick an older one to restore.
 */
export type CtlLatestError = z.infer<typeof RefusalDetailSchema>;
/**
 * A checkpoint directory under the root whose checkpoint.json is there but cannot be read or
 * parsed (or a symbolic link to one): not listed in `checkpoints`, named here with why, as
 * `gym-ckpt ls --json` names it. `gym-ckpt verify <id>` reports it in full.
 */
export const CtlDamagedCheckpointSchema = z.object({ checkpoint_id: CheckpointIdSchema, ...RefusalDetailSchema.shape }).strict();
export type CtlDamagedCheckpoint = z.infer<typeof CtlDamagedCheckpointSchema>;
export const CtlListReplySchema = z
  .object({
    latest: CheckpointIdSchema.nullable(),
    /** Present only with `latest` null (added within version 1; see docs/protocol.md). */
    latest_error: RefusalDetailSchema.optional(),
    checkpoints: z.array(
      z
        .object({
          checkpoint_id: CheckpointIdSchema,
          published_at: z.number(),
          epoch: z.number().int(),
          participants: z.number().int(),
          stop: z.boolean(),
        })
        .strict(),
    ),
    /** Present only when a checkpoint is damaged, sorted by id (added within version 1; see docs/protocol.md). */
    damaged: z.array(CtlDamagedCheckpointSchema).optional(),
    /**
     * Over NATS only, when the damaged entries (never deleted by retention) do not all fit one
     * message: how many were left out, the last ones by id; `damaged` keeps those before them
     * (docs/api.md, "Reply size"). Absent when none was.
     */
    damaged_left_out: z.number().int().min(1).optional(),
  })
  .strict();
export const CtlGetReplySchema = z.object({ latest: z.boolean(), manifest: CtlGlobalManifestSchema }).strict();

/** Every controller op: request and reply schema, and its HTTP route. */
export const CONTROLLER_OPS = {
  checkpoint: { request: CtlCheckpointRequestSchema, reply: CtlCheckpointReplySchema, method: "POST" },
  prepare: { request: CtlPrepareRequestSchema, reply: CtlPrepareReplySchema, method: "POST" },
  commit: { request: CtlCommitRequestSchema, reply: CtlCommitReplySchema, method: "POST" },
  publish: { request: CtlPublishRequestSchema, reply: CtlPublishReplySchema, method: "POST" },
  resume: { request: CtlResumeRequestSchema, reply: CtlResumeReplySchema, method: "POST" },
  renew: { request: CtlRenewRequestSchema, reply: CtlRenewReplySchema, method: "POST" },
  restore: { request: CtlRestoreRequestSchema, reply: CtlRestoreReplySchema, method: "POST" },
  retire: { request: CtlRetireRequestSchema, reply: CtlRetireReplySchema, method: "POST" },
  forget: { request: CtlForgetRequestSchema, reply: CtlForgetReplySchema, method: "POST" },
  status: { request: CtlStatusRequestSchema, reply: CtlStatusReplySchema, method: "GET" },
  list: { request: CtlListRequestSchema, reply: CtlListReplySchema, method: "GET" },
  get: { request: CtlGetRequestSchema, reply: CtlGetReplySchema, method: "GET" },
} as const;

export type ControllerOp = keyof typeof CONTROLLER_OPS;
export const CONTROLLER_OP_NAMES = Object.keys(CONTROLLER_OPS) as ControllerOp[];
export type CtlRequestOf<O extends ControllerOp> = z.infer<(typeof CONTROLLER_OPS)[O]["request"]>;
export type CtlRequestInputOf<O extends ControllerOp> = z.input<(typeof CONTROLLER_OPS)[O]["request"]>;
export type CtlReplyOf<O extends ControllerOp> = z.infer<(typeof CONTROLLER_OPS)[O]["reply"]>;
