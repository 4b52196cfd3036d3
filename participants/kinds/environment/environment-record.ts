import { z } from "zod";
import { EpisodeIdSchema } from "../../../protocol/index.js";

/** A boundary is an opaque JSON object owned by the episode protocol (e.g. `{"next":"verify",...}`). */
export const BoundarySchema = z.record(z.string(), z.unknown());

/**
 * One environment record line: the SOURCE attempt, the sha256 of the task's canonical JSON, and
 * the boundary the episode continues from (null = start over from the input).
 */
export const EnvironmentRecordSchema = z
  .object({
    episode_id: EpisodeIdSchema,
    task_digest: z.string().regex(/^[0-9a-f]{64}$/, "task_digest must be 64 lowercase hex digits"),
    boundary: BoundarySchema.nullable(),
  })
  .strict();
export type EnvironmentRecord = z.infer<typeof EnvironmentRecordSchema>;
