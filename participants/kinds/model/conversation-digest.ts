import { canonicalDigest } from "../../../protocol/index.js";

/** Routes the model participant gates; everything else passes through untracked. */
export const GENERATION_ROUTES = ["/v1/chat/completions", "/v1/responses", "/v1/messages"] as const;

export function isGenerationRoute(route: string): boolean {
  const path = route.split("?")[0]!;
  return GENERATION_ROUTES.some((r) => path.endsWith(r));
}

type Body = Record<string, unknown>;

/**
 * The conversation digest of a generation request: sha256 of the canonical JSON of its items
 * (chat `messages`, responses `instructions`+`input` and, when set, `previous_response_id` and
 * `conversation`, messages `system`+`messages`). A re-issued
 * call with the same conversation has the same digest, whatever its sampling parameters.
 */
export function conversationDigest(route: string, body: Body): string {
  const path = route.split("?")[0]!;
  if (path.endsWith("/v1/responses")) {
    // `input` may hold only the newest turn of a conversation the server keeps: its handle belongs to
    // the conversation (named only when set, so a call without one digests as it always did).
    const continued = Object.fromEntries(
      (["previous_response_id", "conversation"] as const).filter((k) => body[k] !== undefined && body[k] !== null).map((k) => [k, body[k]]),
    );
    return canonicalDigest({ instructions: body.instructions ?? null, input: body.input ?? null, ...continued });
  }
  if (path.endsWith("/v1/messages")) return canonicalDigest({ system: body.system ?? null, messages: body.messages ?? null });
  return canonicalDigest({ messages: body.messages ?? null });
}

const STRUCTURED_FIELDS = ["guided_choice", "guided_grammar", "guided_json", "guided_regex", "guided_whitespace_pattern", "structural_tag", "structured_outputs"] as const;

/**
 * Why a request uses constrained decoding (and so may never be cut: a frozen prefix cannot
 * restore a structured decoder's state), or null for free-form generation.
 */
export function constrainedReason(body: Body): string | null {
  const choice = body.tool_choice;
  if (choice !== undefined && choice !== null && choice !== "auto" && choice !== "none" && !isFreeFormToolChoiceObject(choice)) {
    return typeof choice === "string" ? `tool_choice:${choice}` : "tool_choice:constrained";
  }
  // Structured output, as each generation route spells it: chat `response_format`, the Responses
  // API's `text.format`, the Messages API's `output_format`. Plain text is free-form.
  const text = body.text;
  const formats = {
    response_format: body.response_format,
    "text.format": typeof text === "object" && text !== null ? (text as Body).format : undefined,
    output_format: body.output_format,
  };
  for (const [field, format] of Object.entries(formats)) {
    if (format === undefined || format === null) continue;
    const type = typeof format === "object" && "type" in format ? String((format as { type: unknown }).type) : "unknown";
    if (type !== "text") return `${field}:${type}`;
  }
  for (const field of STRUCTURED_FIELDS) {
    if (body[field] !== undefined && body[field] !== null) return field;
  }
  return null;
}

/** The Messages API's `{type: "auto" | "none"}` (with at most its parallel-use flag): free-form like `"auto"`, `"none"`. */
function isFreeFormToolChoiceObject(choice: unknown): boolean {
  if (typeof choice !== "object" || choice === null || Array.isArray(choice)) return false;
  const { type, ...rest } = choice as Body;
  return (type === "auto" || type === "none") && Object.keys(rest).every((key) => key === "disable_parallel_tool_use");
}

/**
 * The fixed names skip reasons are counted under (`cut_skipped.<name>` in the readiness counts and
 * the `participant.state` gauge): a reason carries request values (`tool_choice:<any string>`,
 * `response_format:<any type>`), which would make label values unbounded. `backend:unknown` is the
 * model kind's own reason (no cut endpoint); `other` is never expected.
 */
export const SKIP_CATEGORIES = ["tool_choice", "response_format", "text.format", "output_format", ...STRUCTURED_FIELDS, "backend:unknown", "other"] as const;
export type SkipCategory = (typeof SKIP_CATEGORIES)[number];

export function skipCategory(reason: string): SkipCategory {
  const name = reason === "backend:unknown" ? reason : reason.split(":")[0]!;
  return (SKIP_CATEGORIES as readonly string[]).includes(name) ? (name as SkipCategory) : "other";
}
