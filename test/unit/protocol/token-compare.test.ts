import { describe, expect, it } from "vitest";
import { BearerTokenSchema, tokensEqual } from "../../../protocol/index.js";

describe("bearer token comparison", () => {
  // The one promise of tokensEqual: only the expected token passes. The other tests compared tokens
  // of different lengths only, so "same length" alone passing (&& turned into ||) went unnoticed.
  it("refuses a wrong token of the expected length", () => {
    expect(tokensEqual("s3creX", "s3cret")).toBe(false);
    expect(tokensEqual("aaaaaa", "s3cret")).toBe(false);
    expect(tokensEqual("s3cret", "s3cret")).toBe(true);
  });

  // "a token may not be empty" is the only length rule: a one-character token is a token.
  it("takes any non-empty visible-ASCII token, even one character long", () => {
    expect(BearerTokenSchema.safeParse("x").success).toBe(true);
    expect(BearerTokenSchema.safeParse("").success).toBe(false);
  });
});
