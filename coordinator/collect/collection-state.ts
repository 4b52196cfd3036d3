import { z } from "zod";
import { CheckpointIdSchema, EpisodeIdSchema } from "../../protocol/index.js";
import { CollectionFieldsSchema } from "./collection-identity.js";

/**
 * `collection.json`: the rollout collector's own state in a checkpoint, referenced from
 * checkpoint.json (with its sha256) as the controller state. A restart restores only when the
 * LATEST checkpoint belongs to the run named in the dispatch log.
 */
export const COLLECTION_STATE_FILE = "collection.json";

export const CollectionStateSchema = z
  .object({
    checkpoint_id: CheckpointIdSchema,
    run_id: z.string().min(1).max(128),
    created_at: z.number(),
    /** Source attempts the checkpoint continues. */
    continued: z.array(EpisodeIdSchema),
    /** In-flight rows that some server could not capture: they restart from input. */
    restarted: z.array(EpisodeIdSchema),
    /**
     * The collection that took it (--tasks, --out, --rollout-id-prefix, as its dispatch log names
     * them): a start whose dispatched.jsonl is lost still tells its own stop checkpoint, its Gym
     * parked in it, from another controller's. Absent from a file written before it.
     */
    collection: CollectionFieldsSchema.optional(),
  })
  .strict();
export type CollectionState = z.infer<typeof CollectionStateSchema>;
