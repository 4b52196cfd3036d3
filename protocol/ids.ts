import { z } from "zod";

/**
 * Identity of rollouts, attempts and checkpoints.
 *
 * A rollout is one logical sample; an attempt is one physical execution of it. Every restored
 * episode continues as attempt+1. The capture key is the attempt-qualified string used in URLs,
 * records and blocker lists: `<rollout>` for attempt 0, `<rollout>-a<N>` otherwise. Rollout ids
 * may not end in `-a<digits>`, which keeps the mapping reversible.
 */

/** Shared by every id that may become a path component or a subject token. */
export const SAFE_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9._-]*$/;
/**
 * SAFE_NAME_PATTERN without an empty dot-separated token (no `..`, no trailing `.`), for the ids that
 * become NATS subject tokens or KV keys: an instance (subjects, the membership key) and a checkpoint
 * id (the decision journal's key). The KV client refuses a key ending in `.`, and the server routes a
 * subject with an empty token to nobody.
 */
export const SUBJECT_SAFE_NAME_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_-]*(\.[A-Za-z0-9_-]+)*$/;
const RESERVED_ATTEMPT_SUFFIX = /-a\d+$/;
const CAPTURE_KEY_SUFFIX = /^(.+)-a([1-9]\d*)$/;

export const MAX_ATTEMPT = 1_000_000;

/** Longest rollout id. */
export const MAX_ROLLOUT_ID_CHARS = 200;

export const RolloutIdSchema = z
  .string()
  .min(1)
  .max(MAX_ROLLOUT_ID_CHARS)
  .regex(SAFE_NAME_PATTERN, "rollout id must match ^[A-Za-z0-9][A-Za-z0-9._-]*$")
  .refine((id) => !RESERVED_ATTEMPT_SUFFIX.test(id), "rollout id may not end in -a<digits> (reserved for attempts)")
  // z.toJSONSchema drops refinements: the OpenAPI document states the rule as JSON Schema.
  .meta({ not: { pattern: RESERVED_ATTEMPT_SUFFIX.source } });
export type RolloutId = z.infer<typeof RolloutIdSchema>;

export const AttemptSchema = z.number().int().min(0).max(MAX_ATTEMPT);

export const EpisodeIdSchema = z
  .object({
    rollout_id: RolloutIdSchema,
    attempt: AttemptSchema.default(0),
  })
  .strict();
export type EpisodeId = z.infer<typeof EpisodeIdSchema>;

/**
 * Why a restore scope cannot be continued, or undefined: it names an attempt with no next attempt
 * (MAX_ATTEMPT), or one rollout at two attempts. Every entry continues as its next attempt and the
 * source attempts are fenced up to the highest, so the lower one's replacement would be installed
 * and refused at once (and each kind would install the pair differently). The same attempt named
 * twice is one entry.
 */
export function restoreScopeIssue(scope: readonly EpisodeId[]): string | undefined {
  for (const episode of scope) {
    if (episode.attempt >= MAX_ATTEMPT) {
      return `episode_ids names rollout ${episode.rollout_id} at attempt ${MAX_ATTEMPT}, the last there is: it cannot continue as a later attempt`;
    }
  }
  const two = twoAttemptsNamed(scope);
  return two && `${two}: a restore continues one attempt per rollout (the checkpointed one)`;
}

/**
 * Why a commit scope cannot be checkpointed, or undefined: it names one rollout at two attempts. A
 * checkpoint captures each rollout once, at one attempt (restore refuses records holding two), so
 * such a scope is a controller's mistake, refused before anything is sent rather than resolved by
 * each kind exporting the higher one.
 */
export function commitScopeIssue(scope: readonly EpisodeId[] | null): string | undefined {
  const two = scope === null ? undefined : twoAttemptsNamed(scope);
  return two && `${two}: a checkpoint captures one attempt per rollout`;
}

/** The scope's first rollout at two attempts, as a refusal's opening ("episode_ids names rollout …"), or undefined. */
function twoAttemptsNamed(scope: readonly EpisodeId[]): string | undefined {
  const two = rolloutAtTwoAttempts(scope);
  return two && `episode_ids names rollout ${two.rollout_id} at attempts ${two.low} and ${two.high}`;
}

/** A commit scope (controller API): at most one attempt per rollout; null (the default) = everything each participant holds. */
export function commitScopeSchema(maxScope: number) {
  return z
    .array(EpisodeIdSchema)
    .max(maxScope)
    .superRefine((scope, ctx) => {
      const issue = commitScopeIssue(scope);
      if (issue) ctx.addIssue({ code: "custom", message: issue });
    })
    .meta({ description: "The episodes the controller continues, at most one attempt per rollout (a rollout named at two attempts is invalid_request); null = everything each participant holds." })
    .nullable()
    .default(null);
}

/**
 * The first rollout the list names at two different attempts (the lower and the higher one), or
 * undefined. The same attempt named twice is not two attempts. Shared by the restore scope check and
 * the kinds' restore validation (a checkpoint captures each rollout once, at its current attempt).
 */
export function rolloutAtTwoAttempts(episodes: readonly EpisodeId[]): { rollout_id: string; low: number; high: number } | undefined {
  const attempts = new Map<string, number>();
  for (const episode of episodes) {
    const seen = attempts.get(episode.rollout_id);
    if (seen !== undefined && seen !== episode.attempt) {
      return { rollout_id: episode.rollout_id, low: Math.min(seen, episode.attempt), high: Math.max(seen, episode.attempt) };
    }
    attempts.set(episode.rollout_id, episode.attempt);
  }
  return undefined;
}

/** A restore scope (controller API and control message): at most one attempt per rollout. */
export function restoreScopeSchema(maxScope: number) {
  return (
    z
      .array(EpisodeIdSchema)
      .max(maxScope)
      .superRefine((scope, ctx) => {
        const issue = restoreScopeIssue(scope);
        if (issue) ctx.addIssue({ code: "custom", message: issue });
      })
      // z.toJSONSchema drops refinements: the OpenAPI document states what JSON Schema can (no
      // attempt MAX_ATTEMPT) and describes the rest (one attempt per rollout).
      .meta({
        description: `The source attempts to continue, each as its next attempt: at most one attempt per rollout (a rollout named at two attempts is invalid_request), and no attempt ${MAX_ATTEMPT}, which has no next attempt.`,
        not: { contains: { type: "object", properties: { attempt: { const: MAX_ATTEMPT } }, required: ["attempt"] } },
      })
  );
}

/**
 * Names a checkpoint directory may not take because the root holds something else of that name: a
 * checkpoint called LATEST would turn the pointer file's path into a directory; `gym-ckpt collect`
 * keeps its lock and dispatch log at the root and, with `--records-dir <root>`, its records in
 * `rollouts/`, which a checkpoint of that name would commit into (and retention then trash whole).
 * Compared case-insensitively, for case-insensitive filesystems. test/unit/protocol keeps the
 * collector's names in step with the collector's constants.
 */
export const RESERVED_CHECKPOINT_IDS: readonly string[] = ["latest", "rollouts", "collector.pid", "dispatched.jsonl"];

/** A pattern matching `name` in any letter case (JSON Schema patterns take no flags). */
export function anyCase(name: string): string {
  return [...name].map((c) => (c.toLowerCase() !== c.toUpperCase() ? `[${c.toUpperCase()}${c.toLowerCase()}]` : c.replace(/[.\\^$|?*+()[\]{}-]/g, "\\$&"))).join("");
}

/** Longest checkpoint id; also the HTTP API's path-parameter limit (`GET /v1/checkpoints/{id}`). */
export const MAX_CHECKPOINT_ID_CHARS = 128;

export const CheckpointIdSchema = z
  .string()
  .min(1)
  .max(MAX_CHECKPOINT_ID_CHARS)
  .regex(SUBJECT_SAFE_NAME_PATTERN, "checkpoint id must match ^[A-Za-z0-9][A-Za-z0-9_-]*(\\.[A-Za-z0-9_-]+)*$ (no .. and no trailing .: it is a NATS KV key)")
  .refine((id) => !RESERVED_CHECKPOINT_IDS.includes(id.toLowerCase()), "checkpoint id may not be LATEST, rollouts, collector.pid or dispatched.jsonl, in any case (the root holds those)")
  // As RolloutIdSchema's rule: the reserved names in any case, as a pattern the OpenAPI document can carry.
  .meta({ not: { pattern: `^(${RESERVED_CHECKPOINT_IDS.map(anyCase).join("|")})$` } });
export type CheckpointId = z.infer<typeof CheckpointIdSchema>;

export const MAX_INSTANCE_CHARS = 128;

/** A server's name in the deployment; becomes a directory name and subject tokens. */
export const InstanceSchema = z
  .string()
  .min(1)
  .max(MAX_INSTANCE_CHARS)
  .regex(SUBJECT_SAFE_NAME_PATTERN, "instance must match ^[A-Za-z0-9][A-Za-z0-9_-]*(\\.[A-Za-z0-9_-]+)*$ (no .. and no trailing .: it becomes NATS subject tokens and a KV key)");
export type Instance = z.infer<typeof InstanceSchema>;

/** A deployment name scopes subjects and KV buckets; no dots, since it is one subject token. */
export const DeploymentSchema = z.string().min(1).max(64).regex(/^[A-Za-z0-9][A-Za-z0-9_-]*$/, "deployment must match ^[A-Za-z0-9][A-Za-z0-9_-]*$");

export const CaptureKeySchema = z
  .string()
  .min(1)
  .max(220)
  .refine((key) => parseCaptureKey(key) !== undefined, "not a valid capture key");

export function captureKey(episode: EpisodeId): string {
  return episode.attempt === 0 ? episode.rollout_id : `${episode.rollout_id}-a${episode.attempt}`;
}

/**
 * The inverse of `captureKey`; undefined for anything `captureKey` cannot produce. It runs on
 * every proxied model call, so it checks RolloutIdSchema's and AttemptSchema's rules directly
 * instead of building a zod result (test/unit/protocol keeps the two in step).
 */
export function parseCaptureKey(key: string): EpisodeId | undefined {
  const match = CAPTURE_KEY_SUFFIX.exec(key);
  const rollout = match ? match[1]! : key;
  const attempt = match ? Number(match[2]) : 0;
  const valid =
    rollout.length <= MAX_ROLLOUT_ID_CHARS && SAFE_NAME_PATTERN.test(rollout) && !RESERVED_ATTEMPT_SUFFIX.test(rollout) && attempt <= MAX_ATTEMPT;
  return valid ? { rollout_id: rollout, attempt } : undefined;
}

export function nextAttempt(episode: EpisodeId): EpisodeId {
  return { rollout_id: episode.rollout_id, attempt: episode.attempt + 1 };
}

export function sameEpisode(a: EpisodeId, b: EpisodeId): boolean {
  return a.rollout_id === b.rollout_id && a.attempt === b.attempt;
}
