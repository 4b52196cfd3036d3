import { z } from "zod";

/**
 * The reference backend's deterministic "policy". With tools, and fewer `tool` messages after the
 * last user message than `metadata.tool_rounds` (default "1"), it calls `tools[0]` with
 * `{"expression": <text after the last "Compute:">}` of the latest user message that has one (the
 * whole last user message when none has); otherwise it answers with the `result` of the last tool
 * message (or that message's raw content, or "ok" when there is none). So a later user turn without
 * `Compute:` (a replay recheck's "check your work above") redoes the task's calculation and answers
 * again, rather than handing the calculator that sentence.
 * `metadata.answer_tokens: "N"` appends N filler tokens to a final answer (benchmarks).
 * As a judge (a user message with `Reference answer:` and then `Candidate answer:` lines, the
 * equivalence verifier's prompt) it answers YES when the two answers (each to its end, over several
 * lines) match after trimming and case-folding, else NO — deterministic, so a replayed verify gets
 * the same verdict.
 */
const MessageSchema = z.object({ role: z.string(), content: z.unknown().optional() }).passthrough();
export const ChatRequestSchema = z
  .object({
    model: z.string().optional(),
    messages: z.array(MessageSchema).min(1).max(4096),
    tools: z.array(z.object({ type: z.string(), function: z.object({ name: z.string() }).passthrough() }).passthrough()).optional(),
    metadata: z.record(z.string(), z.string()).optional(),
    stream: z.boolean().optional(),
    max_tokens: z.number().int().positive().optional(),
  })
  .passthrough();
export type ChatRequest = z.infer<typeof ChatRequestSchema>;

export type PolicyReply =
  | { type: "tool_call"; name: string; arguments: string; tokens: string[] }
  | { type: "answer"; content: string; tokens: string[] };

function text(content: unknown): string {
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((part) => (part && typeof part === "object" && "text" in part ? String((part as { text: unknown }).text) : "")).join("");
  return "";
}

/** Splits text into small pieces so a stream has several chunks. */
export function tokenize(value: string): string[] {
  const out: string[] = [];
  for (let i = 0; i < value.length; i += 4) out.push(value.slice(i, i + 4));
  return out.length ? out : [""];
}

export function decide(request: ChatRequest): PolicyReply {
  const messages = request.messages;
  let lastUser = -1;
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i]!.role === "user") {
      lastUser = i;
      break;
    }
  }
  const verdict = lastUser >= 0 ? judgeVerdict(text(messages[lastUser]!.content)) : undefined;
  if (verdict) return { type: "answer", content: verdict, tokens: tokenize(verdict) };
  const after = messages.slice(lastUser + 1);
  const toolMessages = after.filter((m) => m.role === "tool");
  const rounds = Number.parseInt(request.metadata?.tool_rounds ?? "1", 10);
  const tool = request.tools?.[0];
  if (tool && toolMessages.length < (Number.isFinite(rounds) ? rounds : 1)) {
    const args = JSON.stringify({ expression: taskExpression(messages, lastUser) });
    return { type: "tool_call", name: tool.function.name, arguments: args, tokens: tokenize(args) };
  }
  let answer = "ok";
  const lastTool = toolMessages.at(-1);
  if (lastTool) {
    const raw = text(lastTool.content);
    answer = raw;
    try {
      const parsed = JSON.parse(raw) as unknown;
      if (parsed && typeof parsed === "object" && "result" in parsed) answer = String((parsed as { result: unknown }).result);
    } catch {
      // not JSON: the raw content is the answer
    }
  }
  const filler = Number.parseInt(request.metadata?.answer_tokens ?? "0", 10);
  const tokens = tokenize(answer);
  const limit = Number.isFinite(filler) ? Math.min(Math.max(filler, 0), 100_000) : 0;
  for (let i = 0; i < limit; i++) tokens.push(" tok");
  return { type: "answer", content: tokens.join(""), tokens };
}

/** The text after the last `Compute:` of the latest user message up to `lastUser` that has one. */
function taskExpression(messages: ChatRequest["messages"], lastUser: number): string {
  for (let i = lastUser; i >= 0; i--) {
    if (messages[i]!.role !== "user") continue;
    const userText = text(messages[i]!.content);
    const at = userText.lastIndexOf("Compute:");
    if (at >= 0) return userText.slice(at + "Compute:".length).trim();
  }
  return lastUser >= 0 ? text(messages[lastUser]!.content).trim() : "";
}

/**
 * The fake judge: compares the reference and candidate answers of an equivalence prompt. Both may
 * span lines: the reference runs from `Reference answer:` to the first line starting with
 * `Candidate answer:`, the candidate from there to the end — a candidate's second line is part of
 * it ("42\nor maybe 17" is not "42"), and a `Candidate answer:` line inside the candidate cannot
 * replace it.
 */
function judgeVerdict(prompt: string): "YES" | "NO" | undefined {
  const parts = /(?:^|\n)Reference answer:([\s\S]*?)\nCandidate answer:([\s\S]*)$/.exec(prompt);
  if (!parts) return undefined;
  return parts[1]!.trim().toLowerCase() === parts[2]!.trim().toLowerCase() ? "YES" : "NO";
}
