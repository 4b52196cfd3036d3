import { z } from "zod";
import { EpisodeIdSchema, SAFE_NAME_PATTERN } from "../../../protocol/index.js";
import { BoundarySchema } from "../environment/environment-record.js";

/**
 * One agent record line (protocol §7). `mode` tells a native session (the environment owns the
 * protocol; `boundary` is the turn-loop snapshot) from a legacy `/run` episode (the agent owns the
 * whole episode; `episode` is its step boundary and `session` holds its task digest).
 */
export const AgentRecordSchema = z
  .object({
    episode_id: EpisodeIdSchema,
    mode: z.enum(["session", "legacy"]),
    session_key: z.string().min(1).max(200).regex(SAFE_NAME_PATTERN),
    /** Opaque agent state from the session hooks (legacy: `{task_digest}`). */
    session: z.unknown(),
    /** Turn-loop snapshot of the latest boundary; null = the activation restarts from the session state alone. */
    boundary: BoundarySchema.nullable(),
    /** A legacy episode's own step boundary, or null. */
    episode: BoundarySchema.nullable(),
  })
  .strict();
export type AgentRecord = z.infer<typeof AgentRecordSchema>;

export const LegacySessionSchema = z.object({ task_digest: z.string().regex(/^[0-9a-f]{64}$/) }).strict();
