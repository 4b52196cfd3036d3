import { describe, expect, it } from "vitest";
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
