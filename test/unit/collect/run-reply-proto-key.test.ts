import { describe, expect, it } from "vitest";
import { ResultLineSchema, resultLineText } from "../../../coordinator/collect/results-file.js";
import { parseRunReply } from "../../../coordinator/collect/run-reply.js";

// results.jsonl keeps a /run reply's own fields verbatim: a passthrough object left a key named
// __proto__ out of what it built, so such a field vanished from the row.
describe("a /run reply's __proto__ field", () => {
  it("is kept as data, in the order sent, and the checked fields are still checked", () => {
    const text = '{"reward":1,"__proto__":{"verdict":"ok"},"usage":{"tokens_kept":3,"__proto__":5},"answer":"x"}';
    const reply = parseRunReply(JSON.parse(text));
    expect(reply).not.toBeInstanceOf(Error);
    expect(JSON.stringify(reply)).toBe(text);
    const { trajectory: _trajectory, ...body } = reply as Record<string, unknown>;
    expect(JSON.stringify(body)).toBe(text);
    expect(parseRunReply(JSON.parse('{"reward":"1","__proto__":{}}'))).toBeInstanceOf(Error);
    expect(parseRunReply(JSON.parse('{"reward":1,"usage":{"tokens_kept":-1}}'))).toBeInstanceOf(Error);
  });
});

// The reply is written to results.jsonl as the line's `response`, through ResultLineSchema (a record),
// which left a __proto__ key out: the line written lost the field, and so did a line read back.
describe("a results.jsonl line's response with a __proto__ key", () => {
  const response = JSON.parse('{"reward":1,"__proto__":{"verdict":"ok"},"answer":"x"}') as Record<string, unknown>;
  const line = { rollout_id: "a", attempt: 0, reward: 1, continued: false, finished_at: 1, response };
  const text = '{"rollout_id":"a","attempt":0,"reward":1,"continued":false,"finished_at":1,"response":{"reward":1,"__proto__":{"verdict":"ok"},"answer":"x"}}\n';

  it("is written as data, in the order received", () => {
    expect(resultLineText(line)).toBe(text);
  });

  it("is read back as data, its prototype untouched, and a line otherwise wrong is still refused", () => {
    const parsed = ResultLineSchema.parse(JSON.parse(text));
    expect(JSON.stringify(parsed)).toBe(text.trimEnd());
    expect(Object.getPrototypeOf(parsed.response)).toBe(Object.prototype);
    expect(Object.hasOwn(parsed.response, "__proto__")).toBe(true);
    expect(ResultLineSchema.safeParse({ ...JSON.parse(text), response: [] }).success).toBe(false);
  });
});
