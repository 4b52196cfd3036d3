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
