import { z } from "zod";
import { CheckpointIdSchema, DeploymentSchema, EpisodeIdSchema, InstanceSchema } from "./ids.js";
import { JsonObjectSchema } from "./json-value.js";
import { KindSchema } from "./kinds.js";
import { MANIFEST_SCHEMA_VERSION } from "./version.js";

/**
 * Checkpoint files. Per participant (`gym` is PARTICIPANTS_DIR):
 *   <checkpoint_dir>/gym/<kind>/<instance>/records-<sha256>.jsonl   written first, fsynced, renamed
 *   <checkpoint_dir>/gym/<kind>/<instance>/manifest.json            create-only, written last
 * Globally, written by the coordinator after every commit succeeded:
 *   <checkpoint_dir>/checkpoint.json, then <root>/LATEST.
 */

/** The checkpoint directory's subdirectory that participants' commits write into. */
export const PARTICIPANTS_DIR = "gym";
export const RECORDS_FILE_PATTERN = /^records-[0-9a-f]{64}\.jsonl$/;
export const MANIFEST_FILE = "manifest.json";
export const GLOBAL_MANIFEST_FILE = "checkpoint.json";
export const LATEST_FILE = "LATEST";

/**
 * `<root>/.gym-ckpt-deployment.json`: the deployment whose checkpoints the root holds, written
 * create-only by the first coordinator to start on it and compared by every later start. A dot-name,
 * so no checkpoint id (and no listing of them) can take it.
 */
export const ROOT_DEPLOYMENT_FILE = ".gym-ckpt-deployment.json";
export const MAX_ROOT_DEPLOYMENT_BYTES = 4096;
export const RootDeploymentSchema = z.object({ deployment: DeploymentSchema }).strict();
export type RootDeployment = z.infer<typeof RootDeploymentSchema>;

/**
 * Size limits of the checkpoint files every reader enforces (a larger file is
 * `invalid_checkpoint_state`): a participant's manifest.json, checkpoint.json, and the controller
 * state file checkpoint.json references (hashed at publication while the engine waits on it).
 */
export const MAX_MANIFEST_BYTES = 1 << 20;
export const MAX_GLOBAL_MANIFEST_BYTES = 64 << 20;
export const MAX_CONTROLLER_STATE_FILE_BYTES = 256 << 20;
/**
 * Deepest nesting a checkpoint.json may have, its open-ended parts (participants' `extras`, inline
 * controller state, which a publish already limits to MAX_JSON_DEPTH) included. JSON.parse takes any
 * depth, but JSON.stringify recurses: one nested a few thousand levels (a few KiB of brackets) would parse
 * and pass `verify`, then every reply carrying it (`get`) would overflow the stack, internal_error.
 */
export const MAX_GLOBAL_MANIFEST_NESTING = 1024;

/**
 * Why a checkpoint file (`checkpoint.json`, a participant's `manifest.json`) of another format
 * version is refused, naming both versions; undefined when it names this version (or none: the
 * schema then says what is wrong). Readers check it before the schema: a newer format's added
 * fields would otherwise read as a list of unrecognized keys, which looks like damage.
 */
export function schemaVersionMismatch(value: unknown, file: string): string | undefined {
  if (value === null || typeof value !== "object" || Array.isArray(value)) return undefined;
  const version = (value as { schema_version?: unknown }).schema_version;
  if (typeof version !== "number" || version === MANIFEST_SCHEMA_VERSION) return undefined;
  const writer = version > MANIFEST_SCHEMA_VERSION ? "a newer" : "an older";
  return `${file} has schema_version ${version} (written by ${writer} gym-ckpt); this gym-ckpt reads schema_version ${MANIFEST_SCHEMA_VERSION} only: read it with a gym-ckpt of that format version`;
}

export const Sha256Schema = z.string().regex(/^[0-9a-f]{64}$/, "sha256 must be 64 lowercase hex digits");

export const ParticipantManifestSchema = z
  .object({
    schema_version: z.literal(MANIFEST_SCHEMA_VERSION),
    kind: KindSchema,
    instance: InstanceSchema,
    checkpoint_id: CheckpointIdSchema,
    records_file: z.string().regex(RECORDS_FILE_PATTERN, "records_file must be records-<sha256>.jsonl"),
    records_sha256: Sha256Schema,
    record_count: z.number().int().min(0),
    created_at: z.number(),
    /** Participant-specific fields a restore needs besides the records. */
    extra: JsonObjectSchema,
  })
  .strict()
  .refine((m) => m.records_file === `records-${m.records_sha256}.jsonl`, "records_file must name records_sha256");
export type ParticipantManifest = z.infer<typeof ParticipantManifestSchema>;

/**
 * Every record line starts with the episode it belongs to: the SOURCE attempt that was checkpointed.
 * Kinds extend this with their own strict fields (boundary, session state, ledger rows…).
 */
export const RecordBaseSchema = z.object({ episode_id: EpisodeIdSchema });
export type RecordBase = z.infer<typeof RecordBaseSchema>;

/** Per-participant reference inside the global manifest. */
export const ParticipantEntrySchema = z
  .object({
    kind: KindSchema,
    instance: InstanceSchema,
    /** Relative to the checkpoint directory. */
    manifest_path: z.string(),
    manifest_sha256: Sha256Schema,
    records_sha256: Sha256Schema,
    record_count: z.number().int().min(0),
    episode_ids: z.array(z.string()),
    extras: JsonObjectSchema,
  })
  .strict();
export type ParticipantEntry = z.infer<typeof ParticipantEntrySchema>;

/** The controller's own state: inline JSON, or a file beside checkpoint.json with its digest. */
export const ControllerStateSchema = z.union([
  z.object({ inline: z.unknown() }).strict(),
  z.object({ file: z.string().regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/), sha256: Sha256Schema }).strict(),
]);
export type ControllerState = z.infer<typeof ControllerStateSchema>;

export const GlobalManifestSchema = z
  .object({
    schema_version: z.literal(MANIFEST_SCHEMA_VERSION),
    checkpoint_id: CheckpointIdSchema,
    epoch: z.number().int().min(0),
    prepared_at: z.number(),
    published_at: z.number(),
    stop: z.boolean(),
    /** The episodes the controller continues; null = everything each participant held. */
    scope: z.array(EpisodeIdSchema).nullable(),
    restarts: z.array(z.string()),
    participants: z.array(ParticipantEntrySchema),
    controller_state: ControllerStateSchema.nullable(),
  })
  .strict();
export type GlobalManifest = z.infer<typeof GlobalManifestSchema>;
