import { z } from "zod";
import { CaptureKeySchema } from "../../../protocol/index.js";

/**
 * One token-free lineage row of the capture ledger: which model call of which capture key, its
 * parent call, and where the backend staged its tokens. Written only after the backend
 * acknowledged the call (its response completed successfully).
 */
export const UsageSchema = z
  .object({ prompt_tokens: z.number().int().min(0), completion_tokens: z.number().int().min(0), total_tokens: z.number().int().min(0) })
  .strict();

export const LedgerRowSchema = z
  .object({
    capture_key: CaptureKeySchema,
    model_call_id: z.string().min(1).max(200),
    parent_call_id: z.string().min(1).max(200).nullable(),
    continued_from: z.string().min(1).max(200).nullable(),
    route: z.string().min(1).max(200),
    staging_key: z.string().min(1).max(512).nullable(),
    usage: UsageSchema.nullable(),
    recorded_at: z.number().finite(),
  })
  .strict();
export type LedgerRow = z.infer<typeof LedgerRowSchema>;
