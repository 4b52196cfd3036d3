import { z } from "zod";
import { EpisodeIdSchema } from "../../../protocol/index.js";
import { GenerationCutRecordSchema } from "./generation-cut-contract.js";
import { LedgerRowSchema } from "./ledger-row.js";

/** Lineage rows one model record holds at most (one per delivered call of its episode). */
export const MAX_MODEL_RECORD_ROWS = 100_000;

/**
 * The model participant's checkpoint record for one episode (the SOURCE attempt): its delivered
 * lineage rows and at most one generation cut (both empty for an episode with neither: a restore still
 * replaces what dead executions of its next attempts left).
 */
export const ModelRecordSchema = z
  .object({
    episode_id: EpisodeIdSchema,
    rows: z.array(LedgerRowSchema).max(MAX_MODEL_RECORD_ROWS),
    generation_cuts: z.array(GenerationCutRecordSchema).max(1, "a model record holds at most one generation cut"),
  })
  .strict();
export type ModelRecord = z.infer<typeof ModelRecordSchema>;
