import { describe, expect, it } from "vitest";
import { MathVerifier, extractAnswer, normalizeAnswer } from "../../../participants/verifiers/index.js";

/**
 * docs/verifiers.md: more spellings of one answer that were compared as text and scored 0 —
 * LaTeX's brace-less arguments (`\frac12`, `\boxed 5`), its escaped percent sign `\%`, text
 * wrappers (`\text{…}`), and the Unicode minus sign `−` (U+2212).
 */
const reward = async (expected_answer: string, answer: string) => (await new MathVerifier().verify({ task: { expected_answer }, answer })).reward;

describe("math verifier: brace-less LaTeX arguments, \\%, \\text and the Unicode minus", () => {
  it("reads \\frac with single-digit arguments without braces, as LaTeX does", async () => {
    for (const spelling of ["\\frac12", "\\frac 1 2", "\\dfrac12", "\\frac1{2}", "\\frac{1}2", "\\boxed{\\tfrac12}"]) expect(normalizeAnswer(spelling), spelling).toBe("0.5");
    expect(normalizeAnswer("-\\frac34")).toBe("-0.75");
    expect(await reward("1/2", "$\\frac12$")).toBe(1);
    expect(await reward("\\frac{1}{2}", "1/2")).toBe(1);
    // LaTeX takes one token per argument: \frac123 is ½ followed by 3, not a fraction of 1 and 23.
    expect(normalizeAnswer("\\frac123")).toBe("\\frac123");
    expect(await reward("1/23", "\\frac123")).toBe(0);
  });

  it("reads \\boxed followed by one unbraced token", async () => {
    expect(extractAnswer("so \\boxed 5")).toBe("5");
    expect(extractAnswer("so $\\boxed 42$.")).toBe("42");
    expect(extractAnswer("\\boxed5 is it")).toBe("5");
    expect(await reward("5", "The answer is \\boxed 5.")).toBe(1);
    expect(await reward("-3", "first $\\boxed 4$, then the answer: $\\boxed -3$")).toBe(1);
    // A braced \boxed anywhere wins, as before: prose naming the macro after it changes nothing.
    expect(extractAnswer("\\boxed{5}. I put the result in \\boxed to mark it")).toBe("5");
    expect(extractAnswer("\\boxed 4 or rather \\boxed{5}")).toBe("5");
    expect(extractAnswer("\\boxed$ \\boxed}")).toBe("\\boxed$ \\boxed}");
    expect(await reward("6", "The answer is \\boxed 5")).toBe(0);
    // Another macro is still no \boxed, and braces still win.
    expect(extractAnswer("\\boxedx 5")).toBe("\\boxedx 5");
    expect(extractAnswer("\\boxed {7}")).toBe("7");
  });

  it("reads \\% as a percent sign, and compares the number before a percent sign as a number", async () => {
    expect(normalizeAnswer("50\\%")).toBe("50%");
    expect(await reward("50%", "\\boxed{50\\%}")).toBe(1);
    expect(await reward("50\\%", "50.0%")).toBe(1);
    expect(await reward("12.5%", "$12.50\\%$")).toBe(1);
    // A percentage is not the bare number, nor its fraction.
    expect(await reward("50%", "50")).toBe(0);
    expect(await reward("50%", "0.5")).toBe(0);
    expect(await reward("50%", "51%")).toBe(0);
    expect(normalizeAnswer("abc%")).toBe("abc%");
    expect(normalizeAnswer("%")).toBe("%");
  });

  it("unwraps \\text{…} (and \\textrm, \\mathrm, \\mbox) but keeps what it holds: a unit is compared with a unit", async () => {
    expect(await reward("\\text{Yes}", "yes")).toBe(1);
    expect(await reward("5 cm", "\\boxed{5\\text{ cm}}")).toBe(1);
    expect(await reward("5\\,\\mathrm{cm}", "5\\text{ cm}")).toBe(1);
    expect(await reward("5 cm", "5\\text{ m}")).toBe(0);
    // Against a bare number the unit is set aside (math-units.test.ts); between two units it counts.
    expect(await reward("5 cm", "5\\text{ mm}")).toBe(0);
  });

  it("reads the Unicode minus sign as a minus", async () => {
    expect(normalizeAnswer("−5")).toBe("-5");
    expect(await reward("-5", "\\boxed{−5}")).toBe(1);
    expect(await reward("−\\frac{1}{2}", "-0.5")).toBe(1);
    expect(await reward("5", "−5")).toBe(0);
  });
});
