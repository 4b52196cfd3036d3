import { z } from "zod";
import { keepingProtoKey, type RunTrajectory } from "../../protocol/index.js";
import type { Message, MessageNode, Prompt } from "./trace-record.js";

/**
 * OpenAI-style chat messages (what agents send to the policy) ⇄ record messages, and a finished
 * conversation as a record's linear message graph. Used by the reference environment server to
 * put an episode's trajectory in its `/run` reply and to seed a replayed task's context.
 */
const ChatToolCallFieldsSchema = z
  .object({
    id: z.string(),
    type: z.literal("function"),
    function: keepingProtoKey(z.object({ name: z.string(), arguments: z.string() }).passthrough()),
  })
  .passthrough();
/** Unknown keys pass through, a `__proto__` one too (as the agent's and environment's chat messages). */
export const ChatToolCallSchema = keepingProtoKey(ChatToolCallFieldsSchema);
const ChatMessageLikeFieldsSchema = z
  .object({
    role: z.enum(["system", "user", "assistant", "tool"]),
    content: z.string().nullable().optional(),
    tool_calls: z.array(ChatToolCallSchema).nullable().optional(),
    tool_call_id: z.string().optional(),
    name: z.string().nullable().optional(),
  })
  .passthrough();
export const ChatMessageLikeSchema = keepingProtoKey(ChatMessageLikeFieldsSchema);
export type ChatMessageLike = z.infer<typeof ChatMessageLikeFieldsSchema>;

export function chatToMessage(m: ChatMessageLike): Message {
  const content = m.content ?? "";
  switch (m.role) {
    case "system":
      return { role: "system", content };
    case "user":
      return { role: "user", content };
    case "tool":
      return { role: "tool", tool_call_id: m.tool_call_id ?? "", content, ...(m.name != null && { name: m.name }) };
    case "assistant": {
      const calls = (m.tool_calls ?? []).map((c) => ({ id: c.id, name: c.function.name, arguments: c.function.arguments }));
      const reasoning = chatReasoning(m);
      return {
        role: "assistant",
        content: m.content ?? null,
        ...(reasoning !== undefined && { reasoning_content: reasoning }),
        ...(calls.length > 0 && { tool_calls: calls }),
      };
    }
  }
}

/**
 * An assistant chat message's reasoning, as a record's `reasoning_content` (text, null, or undefined
 * when it has none). The model's reasoning is part of the conversation a replay continues; chat
 * messages pass it through unchecked, so only text, or null, is taken. Newer vLLM names it
 * `reasoning`, taken where `reasoning_content` holds no text (while vLLM sent both, they held the
 * same text).
 */
export function chatReasoning(m: Record<string, unknown>): string | null | undefined {
  const named = [m["reasoning_content"], m["reasoning"]];
  const reasoning = named.find((r) => typeof r === "string" && r.length > 0) ?? named.find((r) => typeof r === "string") ?? named.find((r) => r === null);
  return typeof reasoning === "string" || reasoning === null ? reasoning : undefined;
}

/** Text of record content (image parts have no chat-text form and are dropped). */
function text(content: Message["content"]): string {
  if (content === null || content === undefined) return "";
  return typeof content === "string" ? content : content.map((p) => (p.type === "text" ? p.text : "")).join("");
}

export function messageToChat(m: Message): ChatMessageLike {
  switch (m.role) {
    case "system":
    case "user":
      return { role: m.role, content: text(m.content) };
    case "tool":
      return { role: "tool", tool_call_id: m.tool_call_id, content: text(m.content), ...(m.name != null && { name: m.name }) };
    case "assistant":
      return {
        role: "assistant",
        content: m.content ?? null,
        ...(m.reasoning_content !== undefined && { reasoning_content: m.reasoning_content }),
        ...(m.tool_calls && m.tool_calls.length > 0 && {
          tool_calls: m.tool_calls.map((c) => ({ id: c.id, type: "function" as const, function: { name: c.name, arguments: c.arguments } })),
        }),
      };
  }
}

/** A seed prompt as the chat messages an agent continues from (no system message: the agent adds its own). */
export function promptToChat(prompt: Prompt): ChatMessageLike[] {
  const messages: Message[] = typeof prompt === "string" ? [{ role: "user", content: prompt }] : prompt;
  return messages.filter((m, i) => !(i === 0 && m.role === "system")).map(messageToChat);
}

/**
 * A linear conversation as record nodes. The first `seeded` messages are context the episode was
 * launched with (never sampled, no trainable tokens); later assistant messages came from model calls.
 * No token ids are known here, so readers estimate lengths from characters.
 */
export function nodesFromChat(messages: readonly ChatMessageLike[], seeded: number): MessageNode[] {
  return messages.map((m, i) => ({
    parent: i === 0 ? null : i - 1,
    message: chatToMessage(m),
    sampled: i >= seeded && m.role === "assistant",
    token_ids: [],
    mask: [],
    logprobs: [],
  }));
}

/** The trajectory part of a `/run` reply. */
export function chatTrajectory(input: {
  messages: readonly ChatMessageLike[];
  /** How many leading messages were launch context (system + the task, or system + a replay seed). */
  seeded: number;
  reward: number;
  taskName: string | null;
  /** The record's task prompt: the replay seed, or the first user message of a fresh task. */
  prompt: Prompt | null;
  replay: Record<string, unknown> | null;
  stopCondition?: string | null;
}): RunTrajectory {
  const nodes = nodesFromChat(input.messages, input.seeded);
  return {
    task_name: input.taskName,
    prompt: input.prompt,
    nodes,
    reward: input.reward,
    turns: nodes.filter((n) => n.sampled).length,
    stop_condition: input.stopCondition ?? null,
    is_completed: true,
    replay: input.replay,
  };
}
