import { UsageSchema } from "../kinds/model/ledger-row.js";
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
    const text = Buffer.concat(this.chunks).toString("utf8");
    const candidates: string[] = [];
    const trimmed = text.trim();
    if (trimmed.startsWith("{")) candidates.push(trimmed);
    const lines = text.split("\n");
    for (let i = lines.length - 1; i >= 0 && candidates.length < 8; i--) {
      const line = lines[i]!.trim();
      if (line.startsWith("data:") && line.includes('"usage"')) candidates.push(line.slice(5).trim());
    }
    for (const candidate of candidates) {
      try {
        const parsed = UsageSchema.safeParse(pickUsage(JSON.parse(candidate)));
        if (parsed.success) return parsed.data;
      } catch {
        // partial or not JSON
      }
    }
    return null;
  }
}

function pickUsage(value: unknown): unknown {
  if (!value || typeof value !== "object") return undefined;
  const usage = (value as { usage?: unknown }).usage;
  if (!usage || typeof usage !== "object") return undefined;
  const u = usage as Record<string, unknown>;
  // OpenAI chat names; responses/messages APIs use input/output tokens.
  const prompt = u.prompt_tokens ?? u.input_tokens;
  const completion = u.completion_tokens ?? u.output_tokens;
  if (typeof prompt !== "number" || typeof completion !== "number") return undefined;
  return { prompt_tokens: prompt, completion_tokens: completion, total_tokens: typeof u.total_tokens === "number" ? u.total_tokens : prompt + completion };
}
