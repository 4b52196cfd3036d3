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
