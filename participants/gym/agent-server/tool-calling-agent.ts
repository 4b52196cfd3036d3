import { setTimeout as pause } from "node:timers/promises";
import { z } from "zod";
import { CheckpointError, describeZodError, keepingProtoKey, rolloutPath } from "../../../protocol/index.js";
import { chatReasoning } from "../../replay/chat-trajectory.js";
import { expectOk, isRefusal, postJson, trimSlash } from "./gym-http.js";
import type { GymTask } from "./gym-task.js";

/**
 * The reference tool-calling agent's turn loop, written once and driven either by a native
 * activation (boundaries are lazy snapshots) or by a legacy `/run` episode (boundaries go to the
 * step tracker). A boundary is reported before each model call; the tool round's results are part
 * of the next one. A call to a tool other than the calculator is answered with a tool error. A
 * refused model call (`admission_closed`) parks and retries from the boundary; a refused tool call
 * parks and is sent again.
 */
const ChatMessageFieldsSchema = z
  .object({
    role: z.enum(["system", "user", "assistant", "tool"]),
    content: z.string().nullable(),
    tool_calls: z
      .array(z.object({ id: z.string(), type: z.literal("function"), function: z.object({ name: z.string(), arguments: z.string() }) }))
      .optional(),
    tool_call_id: z.string().optional(),
  })
  .passthrough();
export type ChatMessage = z.infer<typeof ChatMessageFieldsSchema>;
/** A chat message: its other keys pass through, a `__proto__` one too, so it survives a checkpoint's restore. */
export const ChatMessageSchema = keepingProtoKey(ChatMessageFieldsSchema);

/** Longest replayed context an activation accepts (chat messages, no system message). */
export const MAX_SEED_MESSAGES = 60;
/**
 * Largest replayed context an activation accepts, as JSON bytes. The turns hold the model's
 * reasoning, so a reasoning policy's seed of a few turns passes 1 MiB; the seed is sent whole in
 * the activation's first policy call, so it is bounded so that call fits the attach proxy's default
 * generation body (32 MiB, its `--max-body-mib`) with the call's own fields (system prompt, tools,
 * model: under 1 KiB, 64 KiB kept for them). Later calls add the turns made since; this does not bound those.
 */
export const MAX_SEED_BYTES = 32 * 1024 * 1024 - 64 * 1024;
/** `activate`'s body limit: a seed of MAX_SEED_BYTES and its task (an expression of at most 200 characters). */
export const MAX_ACTIVATE_BODY_BYTES = MAX_SEED_BYTES + 64 * 1024;
/** Policy calls an activation makes at most; past them it ends without an answer (scored 0). */
const MAX_TURNS = 16;
/**
 * Longest conversation a boundary may hold, and what the environment accepts as an activation's
 * trajectory. It covers every loop that makes one tool call per turn: system + seed + MAX_TURNS ×
 * (assistant + tool result) + final answer = 1 + 60 + 32 + 1 = 94. A policy making several tool
 * calls per turn can still outgrow it; `runTurnLoop` refuses such a boundary when it is recorded.
 */
export const MAX_LOOP_MESSAGES = 128;

/** The loop state a boundary holds. */
export const LoopStateSchema = z
  .object({
    messages: z.array(ChatMessageSchema).min(2).max(MAX_LOOP_MESSAGES),
    /** Set by the final boundary: the activation already has its answer and makes no more calls. */
    answer: z.string().optional(),
    /**
     * A replayed task's leading messages (system prompt included) that came from its seed: the
     * source rollout's turns, not this episode's progress (checkpoint seeds count turns after them).
     */
    seeded: z.number().int().min(1).max(MAX_LOOP_MESSAGES).optional(),
  })
  .strict();
export type LoopState = z.infer<typeof LoopStateSchema>;

export const CALCULATOR_TOOL = {
  type: "function",
  function: {
    name: "calculator",
    description: "Evaluate an arithmetic expression",
    parameters: { type: "object", properties: { expression: { type: "string" } }, required: ["expression"] },
  },
} as const;

const SYSTEM_PROMPT = "You are a careful calculator agent. Use the calculator tool, then answer with the number only.";

export function initialState(task: GymTask): LoopState {
  return {
    messages: [
      { role: "system", content: SYSTEM_PROMPT },
      { role: "user", content: `Compute: ${task.expression}` },
    ],
  };
}

/** How the loop reports progress to whoever tracks it. */
export interface LoopDriver {
  signal: AbortSignal;
  boundary(state: LoopState): Promise<void>;
  model<T>(call: () => Promise<T>): Promise<T>;
  tool<T>(call: () => Promise<T>): Promise<T>;
  park(): Promise<void>;
}

export interface AgentEndpoints {
  policyUrl: string;
  resourcesUrl: string;
  stream: boolean;
}

export interface LoopResult {
  answer: string;
  modelCalls: number;
  /** The whole conversation, final answer included (the episode's trajectory). */
  messages: ChatMessage[];
}

/** A replayed task: the agent continues from a seeded context instead of the task's first prompt. */
export function seededState(seed: ChatMessage[]): LoopState {
  return { messages: [{ role: "system", content: SYSTEM_PROMPT }, ...seed.map((m) => ({ ...m }))], seeded: 1 + seed.length };
}

export async function runTurnLoop(
  endpoints: AgentEndpoints,
  captureKey: string,
  task: GymTask,
  cookie: string | null,
  start: LoopState,
  driver: LoopDriver,
): Promise<LoopResult> {
  const messages: ChatMessage[] = start.messages.map((m) => ({ ...m }));
  let modelCalls = 0;
  const seeded = start.seeded === undefined ? {} : { seeded: start.seeded };
  if (start.answer !== undefined) return { answer: start.answer, modelCalls, messages };
  for (let turn = 0; turn < MAX_TURNS; turn++) {
    await driver.boundary(restorable({ messages: messages.map((m) => ({ ...m })), ...seeded }));
    let reply: ChatMessage;
    for (;;) {
      try {
        reply = await driver.model(() => callPolicy(endpoints, captureKey, task, messages, driver.signal));
        modelCalls += 1; // answered calls only: one refused admission_closed and sent again is one call
        break;
      } catch (error) {
        if (!isRefusal(error, "admission_closed")) throw error;
        await driver.park();
      }
    }
    const calls = reply.tool_calls ?? [];
    if (calls.length === 0) {
      // The final boundary holds the answer: a crash between here and the caller receiving it must
      // not make the restored activation call the policy again.
      const answer = (reply.content ?? "").trim();
      const final: ChatMessage[] = [...messages.map((m) => ({ ...m })), assistantTurn(reply, [])];
      await driver.boundary(restorable({ messages: final, answer, ...seeded }));
      return { answer, modelCalls, messages: final };
    }
    messages.push(assistantTurn(reply, calls));
    for (const call of calls) {
      const unknown = unknownToolError(call.function.name);
      if (unknown) {
        messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify(unknown) });
        continue;
      }
      let result: unknown;
      for (;;) {
        try {
          result = await driver.tool(() => callCalculator(endpoints, captureKey, cookie, call.function.arguments, driver.signal));
          break;
        } catch (error) {
          // Refused before it ran (the resources server closed admission, or frees the session): sent
          // again after parking, as a refused policy call. Passed on, the caller would take the
          // activation for one that never ran and start its turn loop over, repeating its policy calls.
          if (!isRefusal(error, "admission_closed")) throw error;
          await driver.park();
        }
      }
      messages.push({ role: "tool", tool_call_id: call.id, content: JSON.stringify(result) });
    }
  }
  // The turn budget is spent without an answer (a policy calling tools for ever): the episode ends
  // unanswered, verified and scored as such, not failed internal_error for a policy's behaviour. Its
  // final boundary holds the empty answer, so a restored activation makes no further call.
  const unanswered = messages.map((m) => ({ ...m }));
  await driver.boundary(restorable({ messages: unanswered, answer: "", ...seeded }));
  return { answer: "", modelCalls, messages: unanswered };
}

/**
 * The assistant turn the loop keeps from a policy reply: its content, tool calls and the model's
 * reasoning (`reasoning_content`, the record format's name, also for newer vLLM's `reasoning`), so a
 * parked conversation, the trajectory and a replay continuing from either hold what the model
 * produced. Other keys of the reply (refusal, audio, provider extras) are not kept. A reply without
 * reasoning text gets no key: such conversations are sent, parked and digested as they always were.
 * The reasoning is sent back on later calls (see docs/gym.md, "Reasoning"): what the continued call
 * sends is what was parked, so a restored call's conversation digest matches.
 */
function assistantTurn(reply: ChatMessage, calls: NonNullable<ChatMessage["tool_calls"]>): ChatMessage {
  const reasoning = chatReasoning(reply);
  return {
    role: "assistant",
    content: reply.content ?? null,
    ...(typeof reasoning === "string" && reasoning.length > 0 && { reasoning_content: reasoning }),
    ...(calls.length > 0 && { tool_calls: calls }),
  };
}

/**
 * A boundary is recorded only if a restore would accept it: otherwise the checkpoint would hold a
 * state its own restore refuses (`invalid_checkpoint_state`) and the rollout would be lost there.
 */
function restorable(state: LoopState): LoopState {
  if (LoopStateSchema.safeParse(state).success) return state;
  throw new CheckpointError("internal_error", `the turn loop reached a state no restore accepts (${state.messages.length} messages, at most ${MAX_LOOP_MESSAGES})`);
}

/**
 * A policy call whose connection failed (`upstream_failed`: refused, or cut before its reply was
 * complete) is sent again up to twice, as OpenAI clients do, 250 ms then 500 ms later. It left no
 * capture-ledger row: the model proxy cuts a call whose row it could not write, and the call sent
 * again then gets the proxy's own refusal (`storage_error` while its ledger disk is full), which
 * the caller can act on, instead of the episode failing on a dropped connection.
 */
const POLICY_CALL_REISSUES = 2;
const REISSUE_PAUSE_MS = 250;

async function callPolicy(endpoints: AgentEndpoints, key: string, task: GymTask, messages: ChatMessage[], signal: AbortSignal): Promise<ChatMessage> {
  for (let reissue = 0; ; reissue++) {
    try {
      return await callPolicyOnce(endpoints, key, task, messages, signal);
    } catch (error) {
      if (!isRefusal(error, "upstream_failed") || reissue === POLICY_CALL_REISSUES) throw error;
      await pause(REISSUE_PAUSE_MS * 2 ** reissue, undefined, { signal }).catch(() => {
        throw signal.reason ?? error;
      });
    }
  }
}

async function callPolicyOnce(endpoints: AgentEndpoints, key: string, task: GymTask, messages: ChatMessage[], signal: AbortSignal): Promise<ChatMessage> {
  const url = `${trimSlash(endpoints.policyUrl)}${rolloutPath(key, "/v1/chat/completions")}`;
  const response = await postJson(
    url,
    { model: "policy", messages, tools: [CALCULATOR_TOOL], metadata: { tool_rounds: String(task.tool_rounds) }, stream: endpoints.stream },
    { signal },
  );
  const body = expectOk("policy", response);
  return typeof body === "string" ? assembleStream(body) : firstMessage(body);
}

function firstMessage(body: unknown): ChatMessage {
  const parsed = z.object({ choices: z.array(z.object({ message: ChatMessageSchema }).passthrough()).min(1) }).passthrough().safeParse(body);
  if (!parsed.success) throw new CheckpointError("internal_error", "the policy answered without a message");
  return parsed.data.choices[0]!.message;
}

/**
 * One OpenAI-style stream chunk: only the fields the agent assembles are checked. Passthrough on
 * purpose: servers add keys of their own (id, model, created, usage, finish_reason, logprobs…).
 */
const StreamChunkSchema = z
  .object({
    choices: z
      .array(
        z
          .object({
            delta: z
              .object({
                content: z.string().nullable().optional(),
                reasoning_content: z.string().nullable().optional(),
                reasoning: z.string().nullable().optional(),
                tool_calls: z
                  .array(
                    z
                      .object({
                        index: z.number().int().min(0).nullish(),
                        id: z.string().nullish(),
                        function: z.object({ name: z.string().nullish(), arguments: z.string().nullish() }).passthrough().nullish(),
                      })
                      .passthrough(),
                  )
                  .nullable()
                  .optional(),
              })
              .passthrough()
              .nullish(),
          })
          .passthrough(),
      )
      .optional(),
  })
  .passthrough();

/** A stream chunk, validated: one that is not JSON or holds mistyped fields is the policy's error (internal_error). */
function parseStreamChunk(data: string): z.infer<typeof StreamChunkSchema> {
  let value: unknown;
  try {
    value = JSON.parse(data);
  } catch {
    throw new CheckpointError("internal_error", "the policy streamed a chunk that is not JSON");
  }
  const parsed = StreamChunkSchema.safeParse(value);
  if (!parsed.success) throw new CheckpointError("internal_error", `the policy streamed an invalid chunk: ${describeZodError(parsed.error)}`);
  return parsed.data;
}

/** What an error event of a stream says, bounded (its `message` when it has one). */
function streamErrorMessage(error: unknown): string {
  const message = typeof error === "object" && error !== null && typeof (error as { message?: unknown }).message === "string" ? (error as { message: string }).message : JSON.stringify(error);
  return message.length > 500 ? `${message.slice(0, 500)}…` : message;
}

/** Rebuilds one assistant message from OpenAI-style SSE chunks; a chunk carrying `error` fails the call (upstream_failed). */
export function assembleStream(text: string): ChatMessage {
  let content = "";
  // Reasoning under either name, each kept apart: a server sending both sends the same text twice.
  const reasoning = { reasoning_content: "", reasoning: "" };
  const tools = new Map<number, { id: string; name: string; arguments: string }>();
  for (const line of text.split("\n")) {
    const trimmed = line.trim();
    if (!trimmed.startsWith("data:")) continue;
    const data = trimmed.slice(5).trim();
    if (data === "[DONE]") break;
    const chunk = parseStreamChunk(data);
    // vLLM's engine error inside a 200 stream (`data: {"error":{...}}`, then [DONE]): the call failed,
    // as OpenAI clients raise on it, and the model proxy recorded no ledger row for it, so it is sent
    // again (callPolicy), never assembled into an answer from the text before the error.
    if (chunk.error !== undefined && chunk.error !== null) {
      throw new CheckpointError("upstream_failed", `the policy's stream ended in an error event: ${streamErrorMessage(chunk.error)}`);
    }
    const delta = chunk.choices?.[0]?.delta;
    if (!delta) continue;
    if (typeof delta.content === "string") content += delta.content;
    if (typeof delta.reasoning_content === "string") reasoning.reasoning_content += delta.reasoning_content;
    if (typeof delta.reasoning === "string") reasoning.reasoning += delta.reasoning;
    for (const call of delta.tool_calls ?? []) {
      const index = call.index ?? 0;
      const entry = tools.get(index) ?? { id: "", name: "", arguments: "" };
      if (call.id) entry.id = call.id;
      if (call.function?.name) entry.name += call.function.name;
      if (call.function?.arguments) entry.arguments += call.function.arguments;
      tools.set(index, entry);
    }
  }
  const toolCalls = [...tools.entries()]
    .sort(([a], [b]) => a - b)
    .map(([, t]) => ({ id: t.id, type: "function" as const, function: { name: t.name, arguments: t.arguments } }));
  // Which name wins is chatReasoning's rule, as for a reply that is not streamed.
  const thought = chatReasoning(reasoning);
  return {
    role: "assistant",
    content: content.length ? content : null,
    ...(typeof thought === "string" && thought.length > 0 && { reasoning_content: thought }),
    ...(toolCalls.length && { tool_calls: toolCalls }),
  };
}

/** Longest tool name a tool error quotes: the name is the policy's, of any length. */
const QUOTED_TOOL_NAME_CHARS = 100;

/**
 * The tool error for a call naming a tool this agent does not offer, undefined for the calculator.
 * Answered to the policy as the call's result (as OpenAI-style agents do), so it can correct
 * itself; never run as the calculator, which would answer a call the policy did not make.
 */
function unknownToolError(name: string): { error: string } | undefined {
  if (name === CALCULATOR_TOOL.function.name) return undefined;
  const quoted = name.length > QUOTED_TOOL_NAME_CHARS ? `${name.slice(0, QUOTED_TOOL_NAME_CHARS)}…` : name;
  return { error: `unknown tool ${JSON.stringify(quoted)}: this agent offers ${CALCULATOR_TOOL.function.name}` };
}

async function callCalculator(endpoints: AgentEndpoints, key: string, cookie: string | null, args: string, signal: AbortSignal): Promise<unknown> {
  let expression: unknown;
  try {
    expression = (JSON.parse(args) as { expression?: unknown }).expression;
  } catch {
    expression = undefined;
  }
  if (typeof expression !== "string") return { error: "the calculator needs {\"expression\": string}" };
  const url = `${trimSlash(endpoints.resourcesUrl)}${rolloutPath(key, "/tools/calculator")}`;
  const response = await postJson(url, { expression }, { signal, ...(cookie && { headers: { cookie: `ng_session=${cookie}` } }) });
  if (response.status === 400) return response.body;
  return expectOk("calculator", response);
}
