import { z } from "zod";

/**
 * One rollout record: the JSON form of a finished trace, one per line in a record file.
 * Only `task` is open-ended: it carries taskset-specific fields (a reference answer, say)
 * that the source environment's own task schema validates.
 */

const TextPartSchema = z.object({ type: z.literal("text"), text: z.string() }).strict();
const ImagePartSchema = z
  .object({ type: z.literal("image_url"), image_url: z.object({ url: z.string() }).strict() })
  .strict();
export const ContentSchema = z.union([z.string(), z.array(z.union([TextPartSchema, ImagePartSchema]))]);

export const ToolCallSchema = z
  .object({ id: z.string(), name: z.string(), arguments: z.string() /* raw JSON text as emitted */ })
  .strict();

export const MessageSchema = z.discriminatedUnion("role", [
  z.object({ role: z.literal("system"), content: ContentSchema }).strict(),
  z.object({ role: z.literal("user"), content: ContentSchema }).strict(),
  z
    .object({
      role: z.literal("assistant"),
      content: z.string().nullable().optional(),
      reasoning_content: z.string().nullable().optional(),
      tool_calls: z.array(ToolCallSchema).nullable().optional(),
      provider_state: z.unknown().optional(),
    })
    .strict(),
  z
    .object({
      role: z.literal("tool"),
      tool_call_id: z.string(),
      content: ContentSchema,
      name: z.string().nullable().optional(),
    })
    .strict(),
]);

export const MessageNodeSchema = z
  .object({
    parent: z.number().int().min(0).nullable(),
    message: MessageSchema,
    sampled: z.boolean(),
    token_ids: z.array(z.number().int()),
    mask: z.array(z.boolean()),
    is_content: z.array(z.boolean()).optional(),
    logprobs: z.array(z.number()),
    finish_reason: z.string().nullable().optional(),
    usage: z.unknown().optional(),
  })
  .strict();

export const PromptSchema = z.union([z.string(), z.array(MessageSchema)]);

export const RecordTaskSchema = z
  .object({ idx: z.number().int(), name: z.string().nullable(), prompt: PromptSchema.nullable() })
  .catchall(z.unknown());

export const TraceRecordSchema = z
  .object({
    id: z.string().min(1),
    task: RecordTaskSchema,
    nodes: z.array(MessageNodeSchema),
    rewards: z.record(z.string(), z.number()),
    metrics: z.record(z.string(), z.number()).optional(),
    info: z.record(z.string(), z.unknown()).optional(),
    extra_usage: z.array(z.unknown()).optional(),
    is_completed: z.boolean().optional(),
    stop_condition: z.string().nullable().optional(),
    errors: z.array(z.unknown()).optional(),
    timing: z.unknown().optional(),
  })
  .strict()
  .superRefine((trace, ctx) => {
    // Parents must precede their children: the graph walks rely on it and a cycle would never end.
    trace.nodes.forEach((node, i) => {
      if (node.parent !== null && node.parent >= i) {
        ctx.addIssue({ code: "custom", path: ["nodes", i, "parent"], message: "parent must be an earlier node" });
      }
    });
  });

export type Content = z.infer<typeof ContentSchema>;
export type ToolCall = z.infer<typeof ToolCallSchema>;
export type Message = z.infer<typeof MessageSchema>;
export type MessageNode = z.infer<typeof MessageNodeSchema>;
export type Prompt = z.infer<typeof PromptSchema>;
export type RecordTask = z.infer<typeof RecordTaskSchema>;
export type TraceRecord = z.infer<typeof TraceRecordSchema>;
