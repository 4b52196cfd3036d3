import { z } from "zod";
import { CheckpointIdSchema, EpisodeIdSchema, InstanceSchema, RolloutIdSchema, restoreScopeSchema } from "./ids.js";
import { MAX_JSON_DEPTH, jsonNestsDeeperThan } from "./json-depth.js";
import { JsonObjectSchema, keepingProtoKey } from "./json-value.js";
import { KindSchema } from "./kinds.js";
import { ParticipantManifestSchema, Sha256Schema } from "./manifest.js";

/**
 * Control messages between the coordinator and a participant. Every phase message carries an
 * absolute deadline (Unix epoch seconds) and the coordinator's epoch, the fencing token that
 * lets participants refuse a deposed coordinator.
 */

export const OPS = ["status", "prepare", "renew", "commit", "restore", "resume", "retire", "forget"] as const;
export const OpSchema = z.enum(OPS);
export type Op = z.infer<typeof OpSchema>;
export type PhaseOp = Exclude<Op, "status">;

export const PHASES = ["idle", "preparing", "prepared", "committed", "restored"] as const;
export const PhaseSchema = z.enum(PHASES);
export type Phase = z.infer<typeof PhaseSchema>;

export const MAX_BLOCKERS = 100;
const MAX_SCOPE = 100_000;

const DeadlineSchema = z.number().finite().positive();
const EpochSchema = z.number().int().min(0);

const common = {
  checkpoint_id: CheckpointIdSchema,
  deadline_ts: DeadlineSchema,
  epoch: EpochSchema,
};

/** The longest process incarnation (the coordinator sizes journal entries that carry them by it). */
export const MAX_INCARNATION_CHARS = 64;
/**
 * A participant's process incarnation: random per process, so a restarted participant is a new one.
 * Visible ASCII without `"` and `\`, which JSON writes as themselves, one byte each: the coordinator
 * sizes a restore's journal entries with MAX_INCARNATION_CHARS bytes per restorer before the replies
 * name them, and 64 control characters (`\u0001` is 6 bytes of JSON) would make the entry it then writes
 * larger than the one it checked, refused with the restore already sent.
 */
export const IncarnationSchema = z
  .string()
  .min(1)
  .max(MAX_INCARNATION_CHARS)
  .regex(/^[\x21\x23-\x5b\x5d-\x7e]*$/, "an incarnation must be visible ASCII other than \" and \\ (JSON writes it one byte a character)");

/**
 * Ops about one checkpoint's state inside one process, which a process started after the
 * checkpoint opened never had. Their `incarnation` addresses the process that took part (the one
 * the coordinator saw when the checkpoint opened); any other refuses with `stale_incarnation`.
 * Absent = any incarnation. Restore, retire and forget address whatever process is there now.
 */
export const GUARDED_OPS = ["prepare", "renew", "commit", "resume"] as const;
const guarded = { ...common, incarnation: IncarnationSchema.optional() };

export const MAX_CHECKPOINT_DIR_CHARS = 4096;

/** A directory the coordinator owns and this participant can see: absolute, normalized. */
export const CheckpointDirSchema = z
  .string()
  .min(1)
  .max(MAX_CHECKPOINT_DIR_CHARS)
  .refine((dir) => dir.startsWith("/"), "checkpoint_dir must be absolute")
  .refine((dir) => !dir.split("/").some((part) => part === ".." || part === "."), "checkpoint_dir may not contain . or .. segments")
  .refine((dir) => !dir.includes("\0"), "checkpoint_dir may not contain NUL");

export const StatusRequestSchema = z.object({ epoch: EpochSchema.optional() }).strict();
export const PrepareRequestSchema = z.object(guarded).strict();
export const RenewRequestSchema = z.object(guarded).strict();
export const ResumeRequestSchema = z.object(guarded).strict();
export const CommitRequestSchema = z
  .object({
    ...guarded,
    checkpoint_dir: CheckpointDirSchema,
    /** The episodes the controller continues; null = everything this participant holds. */
    episode_ids: z.array(EpisodeIdSchema).max(MAX_SCOPE).nullable(),
    stop: z.boolean().default(false),
  })
  .strict();
export const RestoreRequestSchema = z
  .object({
    ...common,
    checkpoint_dir: CheckpointDirSchema,
    /** The checkpointed (source) attempts the controller will continue, one attempt per rollout. */
    episode_ids: restoreScopeSchema(MAX_SCOPE),
    /**
     * The sha256 of this participant's manifest.json that checkpoint.json records: the participant
     * installs only a manifest of exactly these bytes, so one replaced after the coordinator checked
     * it is refused. Absent (coordinators before this field) = the manifest as found.
     */
    manifest_sha256: Sha256Schema.optional(),
  })
  .strict();
export const RetireRequestSchema = z
  .object({ ...common, episode_ids: z.array(EpisodeIdSchema).min(1).max(MAX_SCOPE) })
  .strict();
export const ForgetRequestSchema = z
  .object({ ...common, rollout_ids: z.array(RolloutIdSchema).min(1).max(MAX_SCOPE) })
  .strict();

/**
 * The `checkpoint_id` of a retire or forget sent while no checkpoint is open: the op's own name (the
 * field is required). It names no checkpoint, so spans and logs leave it out (`namesCheckpoint`).
 */
export function outsideCheckpointId(op: "retire" | "forget"): string {
  return op;
}

/** Whether a request's `checkpoint_id` names a checkpoint (not `outsideCheckpointId`'s placeholder). */
export function namesCheckpoint(op: string, checkpointId: string): boolean {
  return !((op === "retire" || op === "forget") && checkpointId === op);
}

export const PrepareReportSchema = z
  .object({
    ready: z.boolean(),
    /** At most 100 capture keys or synthetic labels; `blocker_count` is the full count. */
    blockers: z.array(z.string()).max(MAX_BLOCKERS),
    blocker_count: z.number().int().min(0),
    counts: keepingProtoKey(z.record(z.string(), z.number().int())),
    /** Uncapped: in-flight episodes this participant cannot capture; they restart from input. */
    restarts: z.array(z.string()),
    /**
     * Set by a participant that exports only a commit's `episode_ids` (it keeps state for every
     * episode it ever served, like the model's ledger): the coordinator refuses a null-scope commit
     * before the decision, instead of letting this participant refuse it after the others committed.
     */
    scope_required: z.boolean().optional(),
  })
  .strict();
export type PrepareReport = z.infer<typeof PrepareReportSchema>;

/**
 * Kind-specific additions. Nested at most MAX_JSON_DEPTH levels: a commit reply's extras go into
 * checkpoint.json as they are, and nested deeper than its readers take they would publish a checkpoint
 * every reader then refuses (or would overflow the stack of the publication's own JSON.stringify).
 */
const ExtrasSchema = JsonObjectSchema.refine((extras) => !jsonNestsDeeperThan(extras), { message: `must be JSON nested at most ${MAX_JSON_DEPTH} levels deep` });

export const StatusReplySchema = z
  .object({
    kind: KindSchema,
    instance: InstanceSchema,
    phase: PhaseSchema,
    checkpoint_id: CheckpointIdSchema.nullable(),
    lease_expires_at: z.number().nullable(),
    /** Highest coordinator epoch this participant has seen. */
    epoch: EpochSchema,
    retired_rollouts: z.number().int().min(0),
    report: PrepareReportSchema,
    protocol_version: z.number().int(),
    extras: ExtrasSchema,
  })
  .strict();
export const PrepareReplySchema = z.object({ phase: z.enum(["prepared", "preparing", "idle"]), report: PrepareReportSchema }).strict();
export const RenewReplySchema = z.object({ lease_expires_at: z.number() }).strict();
export const CommitReplySchema = z
  .object({
    phase: z.literal("committed"),
    manifest: ParticipantManifestSchema,
    /** Path of manifest.json relative to checkpoint_dir. */
    manifest_path: z.string(),
    manifest_sha256: z.string().regex(/^[0-9a-f]{64}$/),
    /**
     * Capture keys actually exported, sorted; null when listing them would not fit one message
     * (tens of thousands of episodes): `episode_count` and `episode_ids_sha256` (canonicalDigest of
     * the sorted list) then describe them, and the coordinator reads them from the committed records.
     */
    episode_ids: z.array(z.string()).nullable(),
    episode_count: z.number().int().min(0).optional(),
    episode_ids_sha256: Sha256Schema.optional(),
    /** Kind-specific additions, e.g. the model's `staging_keys`. */
    extras: ExtrasSchema,
  })
  .strict()
  .refine((reply) => reply.episode_ids !== null || (reply.episode_count !== undefined && reply.episode_ids_sha256 !== undefined), {
    message: "a commit reply that leaves episode_ids out gives episode_count and episode_ids_sha256",
  });
export const RestoreReplySchema = z
  .object({
    phase: z.literal("restored"),
    source_checkpoint_id: CheckpointIdSchema,
    /** Capture keys of the NEXT attempts that will continue. */
    restored: z.array(z.string()),
    /** The process that restored: the coordinator addresses this restore's resume and retire to it. */
    incarnation: IncarnationSchema.optional(),
  })
  .strict();
export const ResumeReplySchema = z.object({ phase: z.literal("idle"), idempotent: z.boolean() }).strict();
export const RetireReplySchema = z.object({ retired: z.array(z.string()) }).strict();
export const ForgetReplySchema = z.object({ forgotten: z.array(z.string()) }).strict();

export type StatusRequest = z.infer<typeof StatusRequestSchema>;
export type PrepareRequest = z.infer<typeof PrepareRequestSchema>;
export type RenewRequest = z.infer<typeof RenewRequestSchema>;
export type ResumeRequest = z.infer<typeof ResumeRequestSchema>;
export type CommitRequest = z.infer<typeof CommitRequestSchema>;
export type CommitRequestInput = z.input<typeof CommitRequestSchema>;
export type RestoreRequest = z.infer<typeof RestoreRequestSchema>;
export type RetireRequest = z.infer<typeof RetireRequestSchema>;
export type ForgetRequest = z.infer<typeof ForgetRequestSchema>;
export type StatusReply = z.infer<typeof StatusReplySchema>;
export type PrepareReply = z.infer<typeof PrepareReplySchema>;
export type RenewReply = z.infer<typeof RenewReplySchema>;
export type CommitReply = z.infer<typeof CommitReplySchema>;
export type RestoreReply = z.infer<typeof RestoreReplySchema>;
export type ResumeReply = z.infer<typeof ResumeReplySchema>;
export type RetireReply = z.infer<typeof RetireReplySchema>;
export type ForgetReply = z.infer<typeof ForgetReplySchema>;

/** Request and reply schema of every op, so both ends validate from one table. */
export const CONTROL_MESSAGES = {
  status: { request: StatusRequestSchema, reply: StatusReplySchema },
  prepare: { request: PrepareRequestSchema, reply: PrepareReplySchema },
  renew: { request: RenewRequestSchema, reply: RenewReplySchema },
  commit: { request: CommitRequestSchema, reply: CommitReplySchema },
  restore: { request: RestoreRequestSchema, reply: RestoreReplySchema },
  resume: { request: ResumeRequestSchema, reply: ResumeReplySchema },
  retire: { request: RetireRequestSchema, reply: RetireReplySchema },
  forget: { request: ForgetRequestSchema, reply: ForgetReplySchema },
} as const;

export type RequestOf<O extends Op> = z.infer<(typeof CONTROL_MESSAGES)[O]["request"]>;
export type RequestInputOf<O extends Op> = z.input<(typeof CONTROL_MESSAGES)[O]["request"]>;
export type ReplyOf<O extends Op> = z.infer<(typeof CONTROL_MESSAGES)[O]["reply"]>;

/** The latest instant a JavaScript Date holds (8.64e15 ms), in Unix seconds. */
const MAX_DATE_SECONDS = 8.64e12;
/**
 * An announcement's wall-clock time, Unix seconds. Bounded by what a Date holds: a participant names
 * another process's times in its refusals (`toISOString`, which throws a RangeError past it), so
 * one a corrupt or foreign entry carried would make its claim throw instead of taking the entry over.
 */
const AnnouncedAtSchema = z.number().min(0).max(MAX_DATE_SECONDS);

/** Announcement a participant puts in the membership registry and refreshes as a heartbeat. */
export const MemberSchema = z
  .object({
    kind: KindSchema,
    instance: InstanceSchema,
    incarnation: IncarnationSchema,
    started_at: AnnouncedAtSchema,
    heartbeat_at: AnnouncedAtSchema,
    protocol_version: z.number().int(),
  })
  .strict();
export type Member = z.infer<typeof MemberSchema>;
