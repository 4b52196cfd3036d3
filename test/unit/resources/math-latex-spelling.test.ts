import { describe, expect, it } from "vitest";
import { MathVerifier, extractAnswer, normalizeAnswer } from "../../../participants/verifiers/index.js";

/**
 * docs/verifiers.md: the last `\boxed{…}` is the answer, `$` and thousands separators are removed.
 * LaTeX spells each of them more ways than one, and models (and the MATH data set's own answers)
 * use them all: `\boxed {5}`, `1{,}000`, `10,\!000`, `1\,000`, `\$42`. Each was compared as text.
 */
const reward = async (expected_answer: string, answer: string) => (await new MathVerifier().verify({ task: { expected_answer }, answer })).reward;

describe("math verifier: LaTeX spellings", () => {
  it("finds \\boxed with spacing before its brace", async () => {
    expect(extractAnswer("so \\boxed {5}.")).toBe("5");
    expect(extractAnswer("\\boxed{3} then \\boxed\n\t{4}")).toBe("4");
    expect(await reward("5", "The answer is \\boxed {5}")).toBe(1);
    expect(await reward("6", "The answer is \\boxed {5}")).toBe(0);
    // Not a \boxed: another macro.
    expect(extractAnswer("\\boxedx{5}")).toBe("\\boxedx{5}");
  });

  it("reads {,} and a comma followed by LaTeX spacing as a thousands separator", async () => {
    expect(normalizeAnswer("1{,}000")).toBe("1000");
    expect(normalizeAnswer("\\boxed{10,\\!000}")).toBe("10000");
    expect(normalizeAnswer("1\\,234\\,567")).toBe("1234567");
    expect(await reward("1000", "$1{,}000$")).toBe(1);
    expect(await reward("1000000", "\\boxed{1,\\!000,\\!000}")).toBe(1);
    expect(await reward("1001", "1{,}000")).toBe(0);
    // The thousands rule still decides: a leading zero group is no grouping.
    expect(normalizeAnswer("0{,}001")).toBe("0,001");
  });

  it("removes an escaped dollar like a dollar", async () => {
    expect(normalizeAnswer("\\$42")).toBe("42");
    expect(normalizeAnswer("\\boxed{\\$1{,}250.50}")).toBe("1250.5");
    expect(await reward("42", "It costs \\boxed{\\$42}.")).toBe(1);
    expect(await reward("42", "42\\$")).toBe(1);
    expect(await reward("43", "\\$42")).toBe(0);
  });
});
