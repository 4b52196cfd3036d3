import { z } from "zod";
import { EpisodeIdSchema } from "../../../protocol/index.js";

/** The reference task: an arithmetic expression and how many tool rounds the policy should use. */
export const GymTaskSchema = z
  .object({
    expression: z.string().min(1).max(200),
    tool_rounds: z.number().int().min(0).max(8).default(1),
  })
  .strict();
export type GymTask = z.infer<typeof GymTaskSchema>;

/** Each field the schema fills in when left out, with the value it fills in. */
const TASK_DEFAULTS = Object.entries(GymTaskSchema.shape).flatMap(([field, schema]) =>
  schema instanceof z.ZodDefault ? [[field, schema.def.defaultValue] as const] : [],
);

/**
 * Every spelling of a parsed task a `/run` may have been digested from: the servers digest the task
 * as the request spelled it, but earlier ones digested it as parsed (defaults filled in), and a
 * controller may spell a default out or leave it. A restored record of any of these is the same
 * task (BeginOptions.sameTask), so neither an upgrade nor a controller's spelling strands it.
 */
export function taskSpellings(task: GymTask): Record<string, unknown>[] {
  let spellings: Record<string, unknown>[] = [{ ...task }];
  for (const [field, value] of TASK_DEFAULTS) {
    if (task[field as keyof GymTask] !== value) continue;
    spellings = spellings.flatMap((s) => {
      const { [field]: _left, ...without } = s;
      return [s, without];
    });
  }
  return spellings;
}

/** `POST /run` on the environment server and the agent's legacy `/run`. */
export const RunRequestSchema = z
  .object({
    rollout_id: EpisodeIdSchema.shape.rollout_id,
    attempt: EpisodeIdSchema.shape.attempt,
    task: GymTaskSchema,
  })
  .strict();
export type RunRequest = z.infer<typeof RunRequestSchema>;

export interface RunReply {
  rollout_id: string;
  attempt: number;
  reward: number;
  answer: string;
  /** The boundary step the episode continued from, or null when it started from its input. */
  continued_from: string | null;
}
