import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { SKIP_CATEGORIES, constrainedReason, conversationDigest, isGenerationRoute, skipCategory } from "../../../participants/kinds/model/index.js";

const sha = (text: string) => createHash("sha256").update(text).digest("hex");

describe("generation routes", () => {
  it("gates exactly chat completions, responses and messages (query strings ignored)", () => {
    expect(isGenerationRoute("/v1/chat/completions")).toBe(true);
    expect(isGenerationRoute("/v1/responses")).toBe(true);
    expect(isGenerationRoute("/v1/messages?beta=true")).toBe(true);
    expect(isGenerationRoute("/openai/v1/chat/completions")).toBe(true);
    expect(isGenerationRoute("/v1/models")).toBe(false);
    expect(isGenerationRoute("/v1/completions")).toBe(false);
    expect(isGenerationRoute("/v1/embeddings")).toBe(false);
    expect(isGenerationRoute("/health?x=/v1/responses")).toBe(false);
  });
});

describe("conversation digest (canonical JSON, sha256)", () => {
  it("is the sha256 of the sorted, compact JSON of the chat messages", () => {
    const digest = conversationDigest("/v1/chat/completions", { model: "m", messages: [{ role: "user", content: "hi" }] });
    expect(digest).toBe(sha('{"messages":[{"content":"hi","role":"user"}]}'));
  });

  it("ignores key order and sampling parameters, but not the conversation", () => {
    const a = conversationDigest("/v1/chat/completions", { messages: [{ role: "user", content: "hi", name: "u" }], temperature: 0.1, stream: true });
    const b = conversationDigest("/v1/chat/completions", { max_tokens: 9, messages: [{ name: "u", content: "hi", role: "user" }] });
    const c = conversationDigest("/v1/chat/completions", { messages: [{ role: "user", content: "hi!", name: "u" }] });
    expect(a).toBe(b);
    expect(c).not.toBe(a);
  });

  it("on /v1/responses, a conversation continued on the server (previous_response_id, conversation) is part of it", () => {
    const plain = conversationDigest("/v1/responses", { input: "continue" });
    const after1 = conversationDigest("/v1/responses", { input: "continue", previous_response_id: "resp_1" });
    const after2 = conversationDigest("/v1/responses", { input: "continue", previous_response_id: "resp_2" });
    const inConv = conversationDigest("/v1/responses", { input: "continue", conversation: "conv_1" });
    expect(new Set([plain, after1, after2, inConv]).size).toBe(4);
    expect(conversationDigest("/v1/responses", { input: "continue", previous_response_id: "resp_1", temperature: 1 })).toBe(after1);
    expect(conversationDigest("/v1/responses", { input: "continue", previous_response_id: null })).toBe(plain);
  });

  it("uses instructions+input for /v1/responses and system+messages for /v1/messages", () => {
    expect(conversationDigest("/v1/responses", { input: "x", instructions: "be brief", model: "m" })).toBe(sha('{"input":"x","instructions":"be brief"}'));
    expect(conversationDigest("/v1/responses", { input: [{ role: "user", content: "x" }] })).toBe(sha('{"input":[{"content":"x","role":"user"}],"instructions":null}'));
    expect(conversationDigest("/v1/messages?beta=1", { system: "s", messages: [{ role: "user", content: "q" }], max_tokens: 5 })).toBe(
      sha('{"messages":[{"content":"q","role":"user"}],"system":"s"}'),
    );
    expect(conversationDigest("/v1/chat/completions", {})).toBe(sha('{"messages":null}'));
  });
});

describe("constrained-decoding skip reasons", () => {
  it("free-form requests may be cut", () => {
    expect(constrainedReason({ messages: [] })).toBeNull();
    expect(constrainedReason({ tool_choice: "auto" })).toBeNull();
    expect(constrainedReason({ tool_choice: "none" })).toBeNull();
    expect(constrainedReason({ tool_choice: null, response_format: null, guided_json: null })).toBeNull();
    expect(constrainedReason({ response_format: { type: "text" } })).toBeNull();
  });

  it("tool_choice other than auto/none is constrained; named and allowed-tools choices are tool_choice:constrained", () => {
    expect(constrainedReason({ tool_choice: "required" })).toBe("tool_choice:required");
    expect(constrainedReason({ tool_choice: "any" })).toBe("tool_choice:any");
    expect(constrainedReason({ tool_choice: { type: "function", function: { name: "calculator" } } })).toBe("tool_choice:constrained");
    expect(constrainedReason({ tool_choice: { type: "allowed_tools", allowed_tools: { mode: "auto", tools: [] } } })).toBe("tool_choice:constrained");
  });

  it("the Messages API's object spelling of auto and none is free-form; any and tool are constrained", () => {
    expect(constrainedReason({ messages: [], tool_choice: { type: "auto" } })).toBeNull();
    expect(constrainedReason({ messages: [], tool_choice: { type: "auto", disable_parallel_tool_use: true } })).toBeNull();
    expect(constrainedReason({ messages: [], tool_choice: { type: "none" } })).toBeNull();
    expect(constrainedReason({ messages: [], tool_choice: { type: "any" } })).toBe("tool_choice:constrained");
    expect(constrainedReason({ messages: [], tool_choice: { type: "tool", name: "calculator" } })).toBe("tool_choice:constrained");
  });

  it("a non-text response_format is constrained, named by its type", () => {
    expect(constrainedReason({ response_format: { type: "json_object" } })).toBe("response_format:json_object");
    expect(constrainedReason({ response_format: { type: "json_schema", json_schema: { name: "x", schema: {} } } })).toBe("response_format:json_schema");
    expect(constrainedReason({ response_format: "json" })).toBe("response_format:unknown");
  });

  it("the Responses API's text.format and the Messages API's output_format are constrained unless plain text", () => {
    expect(constrainedReason({ input: "x", text: { format: { type: "text" } } })).toBeNull();
    expect(constrainedReason({ input: "x", text: { verbosity: "low" } })).toBeNull();
    expect(constrainedReason({ input: "x", text: { format: { type: "json_schema", name: "a", schema: {} } } })).toBe("text.format:json_schema");
    expect(constrainedReason({ input: "x", text: { format: { type: "json_object" } } })).toBe("text.format:json_object");
    expect(constrainedReason({ messages: [], output_format: { type: "json_schema", schema: {} } })).toBe("output_format:json_schema");
    expect(skipCategory("text.format:json_schema")).toBe("text.format");
    expect(skipCategory("output_format:json_schema")).toBe("output_format");
  });

  it.each(["guided_choice", "guided_grammar", "guided_json", "guided_regex", "guided_whitespace_pattern", "structural_tag", "structured_outputs"])(
    "%s is constrained",
    (field) => {
      expect(constrainedReason({ messages: [], [field]: field === "guided_choice" ? ["a", "b"] : "x" })).toBe(field);
    },
  );
});

describe("skip categories", () => {
  it("map every reason, request values included, to one of a fixed set of names", () => {
    expect(skipCategory("tool_choice:required")).toBe("tool_choice");
    expect(skipCategory(`tool_choice:${"x".repeat(500)}`)).toBe("tool_choice");
    expect(skipCategory("response_format:anything")).toBe("response_format");
    expect(skipCategory("guided_json")).toBe("guided_json");
    expect(skipCategory("structured_outputs")).toBe("structured_outputs");
    expect(skipCategory("backend:unknown")).toBe("backend:unknown");
    expect(skipCategory("backend:other")).toBe("other");
    expect(skipCategory("something_new")).toBe("other");
    expect([...SKIP_CATEGORIES].sort()).toEqual(
      ["tool_choice", "response_format", "text.format", "output_format", "guided_choice", "guided_grammar", "guided_json", "guided_regex", "guided_whitespace_pattern", "structural_tag", "structured_outputs", "backend:unknown", "other"].sort(),
    );
  });
});
