import { describe, expect, it } from "vitest";
import { MathVerifier, normalizeAnswer } from "../../../participants/verifiers/index.js";

/**
 * docs/verifiers.md: `a/b` and `\frac{a}{b}` are compared as numbers. `-1/2` is one; its LaTeX
 * form `-\frac{1}{2}`, how models write a negative fraction, was compared as text.
 */
const reward = async (expected_answer: string, answer: string) => (await new MathVerifier().verify({ task: { expected_answer }, answer })).reward;

describe("math verifier: a sign before \\frac", () => {
  it("is the fraction's sign, as before a/b", async () => {
    expect(normalizeAnswer("\\boxed{-\\frac{1}{2}}")).toBe("-0.5");
    expect(await reward("-1/2", "so \\boxed{-\\frac{1}{2}}")).toBe(1);
    expect(await reward("-0.5", "$-\\frac{2}{4}$")).toBe(1);
    expect(await reward("-\\frac{6}{3}", "-2")).toBe(1);
    expect(await reward("1/2", "\\boxed{-\\frac{1}{2}}")).toBe(0);
  });

  it("stays text when the fraction has a sign on both (not one of the documented forms)", () => {
    expect(normalizeAnswer("-\\frac{-1}{2}")).toBe("-\\frac{-1}{2}");
  });
});

describe("math verifier: \\dfrac and \\tfrac", () => {
  it("are \\frac in display and text style: compared as numbers", async () => {
    expect(normalizeAnswer("\\boxed{\\dfrac{3}{4}}")).toBe("0.75");
    expect(await reward("3/4", "so \\boxed{\\dfrac{3}{4}}")).toBe(1);
    expect(await reward("-0.5", "$-\\tfrac{1}{2}$")).toBe(1);
    expect(await reward("\\dfrac{1}{3}", "\\frac{2}{6}")).toBe(1);
    expect(await reward("1/3", "\\dfrac{1}{4}")).toBe(0);
  });
});
