import { z } from "zod";
import { BearerTokenSchema, MAX_TIMER_MS, timeoutSignal } from "../../protocol/index.js";
import { UNTIMED_FETCH_DISPATCHER } from "../../protocol/untimed-dispatcher.js";
import { readCappedText } from "../../protocol/capped-body.js";

/** A judge's verdict is a short text: a reply past this is refused (the sample is masked judge_failed). */
const MAX_JUDGE_REPLY_BYTES = 8 * 1024 * 1024;

/** Only the fields we read from an OpenAI-compatible chat completion (other fields pass through). */
const ChatCompletionSchema = z.looseObject({
  choices: z.array(z.looseObject({ message: z.looseObject({ content: z.string().nullable() }) })).min(1),
});

export interface JudgeClientOptions {
  /** Base URL of an OpenAI-compatible endpoint, e.g. the reference policy backend. */
  baseUrl: string;
  model?: string;
  /** The only bound on a judge call (default 60 s), above 300 s too. */
  requestTimeoutMs?: number;
  apiKey?: string;
}

export interface ChatMessage {
  role: "system" | "user" | "assistant";
  content: string;
}

/**
 * A judge's reply after its reasoning: a reasoning model's leading think block (`<think>…</think>`,
 * or only its closing tag when the chat template opened the block) is dropped, through the first
 * `</think>`, so the verdict is read from the answer alone. By indexOf, not a pattern: a pattern
 * like `^\s*(?:<think>)?[\s\S]*?<\/think>` backtracks quadratically over leading spacing.
 */
export function afterThinkBlock(reply: string): string {
  const close = reply.indexOf("</think>");
  return close === -1 ? reply : reply.slice(close + "</think>".length);
}

/** Asks a judge model once (non-streaming) and returns its text; throws on any failure. */
export class JudgeClient {
  /** Judge requests sent so far: a counter, since a long-running verifier asks millions of times. */
  callCount = 0;
  constructor(private readonly options: JudgeClientOptions) {
    // fetch speaks only http(s): any other URL (`localhost:8000` parses, as scheme `localhost:`)
    // would fail every call, and every sample would be masked judge_failed without a word.
    // A text that is no URL: new URL's TypeError carries it whole (`input`), which a logger prints.
    if (!URL.canParse(options.baseUrl)) throw new Error("the judge URL is not a URL (it is not echoed: it may carry a password)");
    const { protocol, username, password } = new URL(options.baseUrl);
    if (protocol !== "http:" && protocol !== "https:") throw new Error(`the judge URL must be http:// or https://, not ${protocol}`);
    // fetch refuses a URL with `user:password@` and its refusal quotes the URL: every verify would
    // answer judge_failed with the password in its detail. Refused here, the URL not echoed.
    if (username || password) throw new Error("the judge URL may not carry credentials (user:password@): pass the judge's API key as apiKey (GYM_CKPT_JUDGE_API_KEY)");
    // fetch refuses a header value holding a line break or a NUL, and its refusal quotes the value:
    // every verify would answer judge_failed with the key in its detail. Refused here, not echoed.
    const key = options.apiKey === undefined ? undefined : BearerTokenSchema.safeParse(options.apiKey);
    if (key && !key.success) throw new Error(`the judge API key (apiKey, GYM_CKPT_JUDGE_API_KEY): ${key.error.issues[0]!.message}`);
    // 0 would fail every call at once; past what a timer holds, its timer fires at once too.
    const timeout = options.requestTimeoutMs;
    if (timeout !== undefined && !(timeout >= 1 && timeout <= MAX_TIMER_MS)) {
      throw new Error(`the judge timeout must be from 1 to ${MAX_TIMER_MS} ms, not ${timeout}`);
    }
  }

  async ask(messages: ChatMessage[], signal?: AbortSignal): Promise<string> {
    this.callCount += 1;
    // timeoutSignal, not AbortSignal.timeout: inside AbortSignal.any a GC could collect that (see timeout-signal.ts).
    const timeout = timeoutSignal(this.options.requestTimeoutMs ?? 60_000);
    try {
      return await this.askUntil(messages, signal ? AbortSignal.any([signal, timeout.signal]) : timeout.signal);
    } finally {
      timeout.clear();
    }
  }

  /** One judge call, given up when `signal` aborts (the caller's, or the request timeout). */
  private async askUntil(messages: ChatMessage[], signal: AbortSignal): Promise<string> {
    const response = await fetch(`${this.options.baseUrl.replace(/\/+$/, "")}/v1/chat/completions`, {
      method: "POST",
      headers: { "content-type": "application/json", ...(this.options.apiKey && { authorization: `Bearer ${this.options.apiKey}` }) },
      body: JSON.stringify({ model: this.options.model ?? "judge", messages, stream: false, temperature: 0 }),
      signal,
      // Without it fetch's own 300 s header limit would silently cut a longer requestTimeoutMs.
      dispatcher: UNTIMED_FETCH_DISPATCHER,
      // fetch sends the API key on along a same-origin redirect, to whatever the target is: not followed.
      redirect: "manual",
    });
    if (response.status >= 300 && response.status < 400) {
      await response.body?.cancel().catch(() => undefined);
      throw new Error(`judge answered a redirect (HTTP ${response.status}), not followed: configure the judge URL it points to`);
    }
    if (!response.ok) {
      // Its body is not read: cancelled, so a judge answering errors does not hold connections until GC.
      await response.body?.cancel().catch(() => undefined);
      throw new Error(`judge answered HTTP ${response.status}`);
    }
    let reply: unknown;
    try {
      reply = JSON.parse(await readCappedText(response, MAX_JUDGE_REPLY_BYTES, "judge"));
    } catch (error) {
      if (error instanceof SyntaxError) throw new Error("judge reply is not JSON");
      throw error;
    }
    const parsed = ChatCompletionSchema.safeParse(reply);
    if (!parsed.success) throw new Error("judge reply is not a chat completion");
    return parsed.data.choices[0]!.message.content ?? "";
  }
}
