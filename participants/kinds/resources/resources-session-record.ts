import { z } from "zod";
import { EpisodeIdSchema, JsonValueSchema } from "../../../protocol/index.js";

export const SessionIdSchema = z.string().regex(/^[A-Za-z0-9_-]{8,128}$/, "session id must be 8-128 characters of [A-Za-z0-9_-]");

/** A worker's routing id, as records carry it. */
export const SessionOwnerSchema = z.string().min(1).max(200);

/**
 * One checkpointed resources session. `state` is the server's opaque JSON (null on stateless
 * servers); `owner` is the routing id of the worker that holds the session (null: single worker).
 */
export const ResourcesSessionRecordSchema = z
  .object({
    episode_id: EpisodeIdSchema,
    session_id: SessionIdSchema,
    state: JsonValueSchema.nullable(),
    owner: SessionOwnerSchema.nullable(),
  })
  .strict();
export type ResourcesSessionRecord = z.infer<typeof ResourcesSessionRecordSchema>;
