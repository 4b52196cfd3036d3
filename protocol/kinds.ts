import { z } from "zod";

/** The four participant kinds, one per checkpoint-capable Gym server family. */
export const KINDS = ["environment", "model", "agent", "resources"] as const;
export const KindSchema = z.enum(KINDS);
export type Kind = z.infer<typeof KindSchema>;

/**
 * Stage orders. Prepare parks callers before callees' admission closes: environments park their
 * episodes first, the policy model then closes admission so agents reach a boundary, resources go
 * last because agents and environments call them until they park. Resume is the exact reverse so
 * no server reopens before the servers it calls. Retire and forget stop callers before callees.
 */
export const PREPARE_STAGES: readonly (readonly Kind[])[] = [["environment"], ["model"], ["agent"], ["resources"]];
export const RESUME_STAGES: readonly (readonly Kind[])[] = [["resources"], ["agent"], ["model"], ["environment"]];
export const RETIRE_STAGES: readonly (readonly Kind[])[] = [["environment"], ["agent"], ["model", "resources"]];
