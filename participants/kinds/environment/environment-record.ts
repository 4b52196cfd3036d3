import { z } from "zod";
import { EpisodeIdSchema, isPlainObject, setOwnProperty } from "../../../protocol/index.js";

/**
 * A boundary is an opaque JSON object owned by the episode protocol (e.g. `{"next":"verify",...}`),
 * copied with every key kept as data: `z.record` assigned each key, so a `__proto__` one set the
 * copy's prototype and vanished from the record. Its values are the episode code's, unchecked.
 */
export const BoundarySchema = z.custom<Record<string, unknown>>(isPlainObject, "expected an object").transform((boundary) => {
  const copy: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(boundary)) setOwnProperty(copy, key, value);
  return copy;
});

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
