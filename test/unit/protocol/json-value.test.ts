import { describe, expect, it } from "vitest";
import { z } from "zod";
import { JsonValueSchema, MAX_JSON_DEPTH, keepingProtoKey } from "../../../protocol/index.js";

describe("JsonValueSchema", () => {
  it("keeps a __proto__ key as data, at any depth, without setting a prototype", () => {
    const value = JSON.parse('{"a":1,"__proto__":{"polluted":true},"list":[{"__proto__":[1,2]}]}');
    const parsed = JsonValueSchema.parse(value) as Record<string, any>;
    expect(Object.keys(parsed)).toEqual(["a", "__proto__", "list"]);
    expect(Object.getPrototypeOf(parsed)).toBe(Object.prototype);
    expect((parsed as { polluted?: unknown }).polluted).toBeUndefined();
    expect(Object.getOwnPropertyDescriptor(parsed, "__proto__")?.value).toEqual({ polluted: true });
    expect(JSON.stringify(parsed)).toBe(JSON.stringify(value));
    expect(Object.hasOwn(parsed.list[0], "__proto__")).toBe(true);
  });

  it("returns a deep copy", () => {
    const value = { nested: { items: [1, { x: "y" }] } };
    const parsed = JsonValueSchema.parse(value) as typeof value;
    expect(parsed).toEqual(value);
    expect(parsed.nested).not.toBe(value.nested);
    expect(parsed.nested.items[1]).not.toBe(value.nested.items[1]);
  });

  it.each([
    ["undefined", undefined],
    ["a property holding undefined", { a: undefined }],
    ["NaN", Number.NaN],
    ["Infinity", [Infinity]],
    ["a function", { f: () => 1 }],
    ["a Date", { when: new Date(0) }],
    ["a Map", new Map()],
    ["a bigint", 1n],
  ])("refuses %s, as z.json() does", (_what, value) => {
    expect(JsonValueSchema.safeParse(value).success).toBe(false);
  });

  it(`refuses a value nested more than ${MAX_JSON_DEPTH} levels deep, without overflowing the stack`, () => {
    const nest = (levels: number) => JSON.parse("[".repeat(levels) + "]".repeat(levels));
    expect(JsonValueSchema.safeParse(nest(MAX_JSON_DEPTH)).success).toBe(true);
    expect(JsonValueSchema.safeParse(nest(MAX_JSON_DEPTH + 1)).success).toBe(false);
    expect(JsonValueSchema.safeParse(nest(100_000)).success).toBe(false);
  });
});

describe("keepingProtoKey", () => {
  // `__proto__` was parsed under the fixed stand-in name "\u0000__proto__": an input with that key
  // too had its value replaced by the __proto__ key's (and checked only under it).
  it("keeps a \\u0000__proto__ key apart from a __proto__ key, each checked under its own name", () => {
    const schema = keepingProtoKey(z.record(z.string(), z.number()));
    const value = JSON.parse('{"\\u0000__proto__":1,"__proto__":2,"\\u0000\\u0000__proto__":3}');
    const parsed = schema.parse(value);
    expect(Object.keys(parsed)).toEqual(["\u0000__proto__", "__proto__", "\u0000\u0000__proto__"]);
    expect(parsed["\u0000__proto__"]).toBe(1);
    expect(Object.getOwnPropertyDescriptor(parsed, "__proto__")?.value).toBe(2);
    expect(parsed["\u0000\u0000__proto__"]).toBe(3);
    const refused = schema.safeParse(JSON.parse('{"\\u0000__proto__":"one","__proto__":2}'));
    expect(refused.success).toBe(false);
    expect(refused.error?.issues.map((issue) => issue.path)).toEqual([["\u0000__proto__"]]);
  });
});
