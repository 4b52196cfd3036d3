import type { LedgerRow } from "../kinds/model/ledger-row.js";

/**
 * Keeps only the last few KiB of a response passing through, so the proxy can read the `usage`
 * block (a non-streamed body, or the final SSE chunk) without ever buffering a whole stream.
 */
export class UsageTail {
  private chunks: Buffer[] = [];
  private size = 0;
  /** Bytes pushed in all. */
  private total = 0;
  /** Stream offsets where the events in the tail begin, oldest first (the first event follows no blank line). */
  private readonly starts: number[] = [0];
  /**
   * The first bytes of the newest event that began before the tail, copied as its start left it: an
   * event longer than the tail (a `response.failed` event carries the whole output so far) is still
   * known by its name and how its data begins, however many events (comments, `[DONE]`) follow it.
   */
  private headBeforeTail: Buffer | undefined;
  /** The last two bytes pushed, newest first (-1: none yet): a blank line may span two chunks. */
  private last1 = -1;
  private last2 = -1;
  constructor(private readonly limit = 16 * 1024) {}

  /** Runs for every chunk of every proxied answer: no copies, one native search per line end. */
  push(chunk: Buffer): void {
    // An event begins after a blank line: `\n\n`, `\r\n\r\n` (matched by its `\n\r\n`), or `\r\r`
    // (SSE lines may end in a bare CR).
    const at = this.starts.length;
    for (let i = chunk.indexOf(LF); i !== -1; i = chunk.indexOf(LF, i + 1)) {
      const before = this.byteAt(chunk, i - 1);
      if (before === LF || (before === CR && this.byteAt(chunk, i - 2) === LF)) this.starts.push(this.total + i + 1);
    }
    let bareCr = false;
    for (let i = chunk.indexOf(CR); i !== -1; i = chunk.indexOf(CR, i + 1)) {
      if (this.byteAt(chunk, i - 1) !== CR) continue;
      this.starts.push(this.total + i + 1);
      bareCr = true;
    }
    // Both kinds in one chunk: back in stream order.
    if (bareCr && this.starts.length - at > 1) this.starts.splice(at, Infinity, ...this.starts.slice(at).sort((a, b) => a - b));
    if (chunk.length >= 2) {
      this.last2 = chunk[chunk.length - 2]!;
      this.last1 = chunk[chunk.length - 1]!;
    } else if (chunk.length === 1) {
      this.last2 = this.last1;
      this.last1 = chunk[0]!;
    }
    this.total += chunk.length;
    this.chunks.push(chunk);
    this.size += chunk.length;
    while (this.size - this.chunks[0]!.length >= this.limit && this.chunks.length > 1) this.dropOldest();
  }

  /** Stream offset of the tail's first byte. */
  private get tailStart(): number {
    return this.total - this.size;
  }

  /** The byte at `i` in `chunk`, or just before it (-1, -2) in what was pushed earlier. */
  private byteAt(chunk: Buffer, i: number): number {
    return i >= 0 ? chunk[i]! : i === -1 ? this.last1 : this.last2;
  }

  /** The oldest chunk leaves the tail; the head of the newest event beginning in it is copied first. */
  private dropOldest(): void {
    const dropped = this.chunks[0]!;
    const end = this.tailStart + dropped.length;
    let newest: number | undefined;
    while (this.starts.length > 0 && this.starts[0]! < end) newest = this.starts.shift();
    if (newest !== undefined) this.headBeforeTail = this.bytesFrom(newest, HEAD_BYTES);
    this.chunks.shift();
    this.size -= dropped.length;
  }

  /** Up to `length` kept bytes from stream offset `at` (copied: a head must not keep its chunks alive). */
  private bytesFrom(at: number, length: number): Buffer {
    const parts: Buffer[] = [];
    let offset = this.tailStart;
    let left = length;
    for (const chunk of this.chunks) {
      if (left === 0) break;
      const skip = Math.max(at - offset, 0);
      if (skip < chunk.length) {
        const part = chunk.subarray(skip, skip + left);
        parts.push(part);
        left -= part.length;
      }
      offset += chunk.length;
    }
    return Buffer.from(Buffer.concat(parts));
  }

  usage(): LedgerRow["usage"] {
    // The usage block is almost always in the last event (or at the end of a small body): try the
    // last KiB before decoding the whole tail.
    const recent = this.recentText(QUICK_BYTES);
    if (recent.partial) {
      const found = usageIn(recent.text);
      if (found) return found;
    }
    return usageIn(this.text());
  }

  /**
   * The stream's last event (past `data: [DONE]`) is an error: a 200 answer that failed after all —
   * vLLM's `data: {"error":{...}}`, the Responses API's `response.failed` or `error` event, the
   * Messages API's `event: error`. Only SSE `event:`/`data:` lines count, so a JSON body never matches.
   */
  endsInError(): boolean {
    // Judged on the response's critical path (its end waits for the ledger row): from the last KiB
    // when the event is in there, as it almost always is, before decoding the whole tail.
    const recent = this.recentText(QUICK_BYTES);
    if (recent.partial) {
      const verdict = this.lastEventIsError(recent.text, false);
      if (verdict !== undefined) return verdict;
    }
    return this.lastEventIsError(this.text(), true) ?? false;
  }

  /**
   * Whether the newest event in `text` that is not blank, a comment or the end marker is an error.
   * `text` is the whole tail, or (`wholeTail` false) its newest chunks: then undefined where that
   * event, or the start of every event in it, lies before them.
   */
  private lastEventIsError(text: string, wholeTail: boolean): boolean | undefined {
    const cutBlankLine = this.tailStart > 0 && this.beginsAfterBlankLine();
    const bareCr = text.includes("\r\r"); // looked for only where it occurs (every call runs this)
    for (let end = text.length; end > 0; ) {
      const start = Math.max(text.lastIndexOf("\n\n", end - 1), text.lastIndexOf("\n\r\n", end - 1), bareCr ? text.lastIndexOf("\r\r", end - 1) : -1);
      if (start === -1 && !wholeTail) return undefined;
      const whole = start !== -1 || this.tailStart === 0 || cutBlankLine;
      // An event that began before the tail: judged by its head (name, how its data begins).
      const verdict = eventIsError(whole ? text.slice(start + 1, end) : this.headAtTailStart(), whole);
      if (verdict !== undefined) return verdict;
      end = start;
    }
    // The tail began inside the blank line ending an event, and nothing after it decides: that event, by its head.
    if (wholeTail && cutBlankLine) return eventIsError(this.headAtTailStart(), false) ?? false;
    return wholeTail ? false : undefined;
  }

  /**
   * The tail's first bytes end a blank line whose first newline was dropped: the event after them
   * lies whole in the tail, though no blank line in its text says so (its head would be the previous event's).
   */
  private beginsAfterBlankLine(): boolean {
    const from = this.tailStart;
    for (const at of this.starts) {
      if (at > from + 2) return false;
      if (at > from) return true;
    }
    return false;
  }

  /** The whole tail, decoded. */
  private text(): string {
    return Buffer.concat(this.chunks).toString("utf8");
  }

  /** The newest chunks holding at least `bytes` bytes, decoded; `partial` when older chunks are left out. */
  private recentText(bytes: number): { text: string; partial: boolean } {
    let size = 0;
    let from = this.chunks.length;
    while (from > 0 && size < bytes) size += this.chunks[--from]!.length;
    return { text: Buffer.concat(this.chunks.slice(from)).toString("utf8"), partial: from > 0 };
  }

  /** The head of the event that holds the tail's first byte. */
  private headAtTailStart(): string {
    const from = this.tailStart;
    const head = this.starts[0] === from ? this.bytesFrom(from, HEAD_BYTES) : this.headBeforeTail;
    return head?.toString("utf8") ?? "";
  }
}

/** How many of the newest bytes the usage and the last event are looked for in first. */
const QUICK_BYTES = 1024;
/** How much of an event's beginning is kept (of the newest one that began before the tail). */
const HEAD_BYTES = 512;
/** The data of an error event cut short: its first member says so (as isErrorData reads a whole one). */
const ERROR_DATA_START = /^\{\s*("error"\s*:\s*\{|"(type|object)"\s*:\s*"(error|response\.failed)")/;

/** Whether an event (whole, or its head) is an error; undefined for one that decides nothing: blank, a comment, the end marker. */
function eventIsError(eventText: string, whole: boolean): boolean | undefined {
  const lines = eventText.split(/\r\n|\r|\n/).map((line) => line.trim()).filter(Boolean);
  const eventName = lines.find((line) => line.startsWith("event:"))?.slice(6).trim();
  const data = lines.filter((line) => line.startsWith("data:")).map((line) => line.slice(5).trim()).join("\n");
  if (!eventName && (!data || data === "[DONE]")) return undefined;
  if (eventName === "error" || eventName === "response.failed") return true;
  return whole ? isErrorData(data) : ERROR_DATA_START.test(data);
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

function usageIn(sent: string): LedgerRow["usage"] {
  // Lines ending in a bare CR read as lines too (CRLF and LF need nothing).
  const text = /\r(?!\n)/.test(sent) ? sent.replace(/\r\n?/g, "\n") : sent;
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
  // None whole: a long event (a `response.completed` carries the whole output) began before the
  // tail; its usage block, near its end, is still read from the newest `"usage":{…}` in the tail.
  if (prompt === undefined && completion === undefined) {
    const counts = pickUsage({ usage: lastUsageBlock(text) });
    prompt = counts?.prompt;
    completion = counts?.completion;
    total = counts?.total;
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

/** The newest `"usage": {…}` object in `text` (not one quoted inside a JSON string), parsed; undefined if none is whole. */
function lastUsageBlock(text: string): unknown {
  for (let at = text.lastIndexOf('"usage"'); at > 0; at = text.lastIndexOf('"usage"', at - 1)) {
    if (text[at - 1] === "\\") continue; // `\"usage\"` inside a string
    const open = /^"usage"\s*:\s*\{/.exec(text.slice(at, at + 64));
    if (!open) continue;
    const start = at + open[0].length - 1;
    const end = objectEnd(text, start);
    if (end === -1) continue;
    try {
      return JSON.parse(text.slice(start, end + 1));
    } catch {
      continue;
    }
  }
  return undefined;
}

/** The index of the `}` closing the object that opens at `start`, or -1. */
function objectEnd(text: string, start: number): number {
  let depth = 0;
  let inString = false;
  for (let i = start; i < text.length; i++) {
    const c = text[i];
    if (inString) {
      if (c === "\\") i += 1;
      else if (c === '"') inString = false;
    } else if (c === '"') inString = true;
    else if (c === "{") depth += 1;
    else if (c === "}" && --depth === 0) return i;
  }
  return -1;
}

const LF = 0x0a;
const CR = 0x0d;
