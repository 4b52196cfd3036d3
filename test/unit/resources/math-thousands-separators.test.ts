import { describe, expect, it } from "vitest";
import { MathVerifier, normalizeAnswer } from "../../../participants/verifiers/index.js";

/**
 * docs/verifiers.md: thousands separators are removed. Only a number grouped by thousands has
 * them: a leading group of zeros ("0,001", "0,500": a decimal comma) is no such number.
 */
describe("math verifier: thousands separators", () => {
  const reward = async (expected_answer: string, answer: string) => (await new MathVerifier().verify({ task: { expected_answer }, answer })).reward;

  it("are removed from a number grouped by thousands", async () => {
    expect(await reward("1000", "1,000")).toBe(1);
    expect(await reward("-1234567.5", "-1,234,567.5")).toBe(1);
    expect(await reward("100000", "\\boxed{100,000}")).toBe(1);
  });

  it("are not read into a number whose leading group is zero: 0,001 is not 1", async () => {
    expect(await reward("1", "0,001")).toBe(0);
    expect(await reward("500", "0,500")).toBe(0);
    expect(await reward("-1", "-0,001")).toBe(0);
    expect(await reward("0", "000,000")).toBe(0);
    expect(normalizeAnswer("0,001")).toBe("0,001");
  });
});

describe("math verifier: a comma followed by spacing", () => {
  const reward = async (expected_answer: string, answer: string) => (await new MathVerifier().verify({ task: { expected_answer }, answer })).reward;

  it("separates list items, not thousands: '2, 345' is not 2345", async () => {
    expect(await reward("2345", "\\boxed{2, 345}")).toBe(0);
    expect(await reward("2, 345", "2345")).toBe(0);
    expect(await reward("1000", "1,\\ 000")).toBe(0);
    expect(await reward("2, 345", "\\boxed{2,345}")).toBe(0);
    // A list still equals itself, spacing aside.
    expect(await reward("2, 345", "\\boxed{2,  345}")).toBe(1);
    // LaTeX's negative thin space is no spacing: 10,\!000 is ten thousand.
    expect(await reward("10000", "10,\\!000")).toBe(1);
  });
});
