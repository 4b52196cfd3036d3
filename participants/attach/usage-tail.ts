import type { LedgerRow } from "../kinds/model/ledger-row.js";

/**
 * Keeps only the last few KiB of a response passing through, so the proxy can read the `usage`
 * block (a non-streamed body, or the final SSE chunk) without ever buffering a whole stream.
 */
export class UsageTail {
  private chunks: Buffer[] = [];
  private size = 0;
  constructor(private readonly limit = 16 * 1024) {}

  push(chunk: Buffer): void {
    this.chunks.push(chunk);
    this.size += chunk.length;
    while (this.size - this.chunks[0]!.length >= this.limit && this.chunks.length > 1) this.size -= this.chunks.shift()!.length;
  }

  usage(): LedgerRow["usage"] {
    // The usage block is almost always in the last event (or at the end of a small body): try the
    // last KiB before decoding the whole tail.
    let quick = 0;
    let from = this.chunks.length;
    while (from > 0 && quick < 1024) quick += this.chunks[--from]!.length;
    if (from > 0) {
      const found = usageIn(Buffer.concat(this.chunks.slice(from)).toString("utf8"));
      if (found) return found;
    }
    return usageIn(Buffer.concat(this.chunks).toString("utf8"));
  }

  /**
   * The stream's last event (past `data: [DONE]`) is an error: a 200 answer that failed after all —
   * vLLM's `data: {"error":{...}}`, the Responses API's `response.failed` or `error` event, the
   * Messages API's `event: error`. Only SSE `event:`/`data:` lines count, so a JSON body never matches.
   */
  endsInError(): boolean {
    const text = Buffer.concat(this.chunks).toString("utf8");
    for (let end = text.length; end > 0; ) {
      const start = Math.max(text.lastIndexOf("\n\n", end - 1), text.lastIndexOf("\n\r\n", end - 1));
      const lines = text.slice(start + 1, end).split(/\r?\n/).map((line) => line.trim()).filter(Boolean);
      end = start;
      const eventName = lines.find((line) => line.startsWith("event:"))?.slice(6).trim();
      const data = lines.filter((line) => line.startsWith("data:")).map((line) => line.slice(5).trim()).join("\n");
      if (!eventName && (!data || data === "[DONE]")) continue; // blank, a comment, or the end marker
      if (eventName === "error" || eventName === "response.failed") return true;
      return isErrorData(data);
    }
    return false;
  }
}

function isErrorData(data: string): boolean {
  if (!data.startsWith("{")) return false;
  try {
    const value = JSON.parse(data) as { error?: unknown; type?: unknown; object?: unknown };
    // Older vLLM streams an ErrorResponse (`"object":"error"`) instead of `{"error":{...}}`.
    return (value.error !== undefined && value.error !== null) || value.type === "error" || value.type === "response.failed" || value.object === "error";
  } catch {
    return false; // cut at the tail's start, or not JSON
  }
}

function usageIn(text: string): LedgerRow["usage"] {
  const candidates: string[] = [];
  const trimmed = text.trim();
  if (trimmed.startsWith("{")) candidates.push(trimmed);
  // Walk the lines backwards without splitting the whole tail.
  for (let end = text.length; end > 0 && candidates.length < 8; ) {
    const start = text.lastIndexOf("\n", end - 1) + 1;
    const line = text.slice(start, end).trim();
    if (line.startsWith("data:") && line.includes('"usage"')) candidates.push(line.slice(5).trim());
    end = start - 1;
  }
  // Newest first. A streamed Messages API answer reports output tokens in its last
  // `message_delta` and input tokens in `message_start`: take each from the newest event naming it.
  let prompt: number | undefined;
  let completion: number | undefined;
  let total: number | undefined;
  for (const candidate of candidates) {
    let counts: UsageCounts | undefined;
    try {
      counts = pickUsage(JSON.parse(candidate));
    } catch {
      continue; // partial or not JSON
    }
    if (!counts) continue;
    prompt ??= counts.prompt;
    completion ??= counts.completion;
    total ??= counts.total;
    if (prompt !== undefined && completion !== undefined) break;
  }
  if (prompt === undefined || completion === undefined) return null;
  // Checked here by hand (this runs once per call); the ledger row's schema validates it again.
  const usage = { prompt_tokens: prompt, completion_tokens: completion, total_tokens: total ?? prompt + completion };
  return Object.values(usage).every((n) => Number.isSafeInteger(n) && n >= 0) ? usage : null;
}

interface UsageCounts {
  prompt?: number;
  completion?: number;
  total?: number;
}

const num = (value: unknown): number | undefined => (typeof value === "number" ? value : undefined);

/** The usage block of a chat completion (chunk), a responses event (`response.usage`) or a messages event (`message.usage`). */
function pickUsage(value: unknown): UsageCounts | undefined {
  if (!value || typeof value !== "object") return undefined;
  const v = value as { usage?: unknown; response?: { usage?: unknown }; message?: { usage?: unknown } };
  const usage = v.usage ?? v.response?.usage ?? v.message?.usage;
  if (!usage || typeof usage !== "object") return undefined;
  const u = usage as Record<string, unknown>;
  // OpenAI chat names; responses/messages APIs use input/output tokens.
  const counts = { prompt: num(u.prompt_tokens) ?? num(u.input_tokens), completion: num(u.completion_tokens) ?? num(u.output_tokens), total: num(u.total_tokens) };
  return counts.prompt === undefined && counts.completion === undefined ? undefined : counts;
}
