import { describe, expect, it } from "vitest";
import { MathVerifier, normalizeAnswer } from "../../../participants/verifiers/index.js";

/**
 * docs/verifiers.md: integers are compared exactly, other numbers to 12 significant digits. A
 * non-integer rounded to 12 significant digits at 10^12 or above drops integer digits, and was
 * written like an integer: 20! + 0.5 became `2432902008180000000`, equal to that integer (3,359,999.5
 * away) while 20! itself (0.5 away) was not. The rule: a number rounded to 12 significant digits
 * equals an integer only when those digits reach the units digit (below 10^12), where one integer
 * at most rounds to it; floating-point noise (`2.9999999999999`) still equals its integer.
 */
const reward = async (expected_answer: string, answer: string) => (await new MathVerifier().verify({ task: { expected_answer }, answer })).reward;

describe("math verifier: a rounded number and an integer", () => {
  it("are never equal when the rounding dropped integer digits", async () => {
    expect(await reward("2432902008180000000", "2432902008176640000.5")).toBe(0);
    expect(await reward("2432902008176640000.5", "\\boxed{2432902008180000000}")).toBe(0);
    expect(await reward("2432902008176640000", "2432902008176640000.5")).toBe(0);
    // An inexact quotient too: 10^20 / 3 is no integer.
    expect(await reward("100000000000000000000/3", "33333333333300000000")).toBe(0);
    expect(await reward("1000000000000", "999999999999.5")).toBe(0);
    expect(normalizeAnswer("2432902008176640000.5")).toBe("2.43290200818e+18");
    expect(normalizeAnswer("100000000000000000000/3")).toBe("3.33333333333e+19");
  });

  it("still compares two such numbers to 12 significant digits", async () => {
    expect(await reward("2432902008176640000.5", "2432902008176640000.7")).toBe(1);
    expect(await reward("100000000000000000000/3", "33333333333333333333.33")).toBe(1);
    expect(await reward("100000000000000000000/3", "33333333334333333333.33")).toBe(0);
  });

  it("are equal when the rounding is below the units digit: floating-point noise", async () => {
    expect(await reward("3", "2.9999999999999")).toBe(1);
    expect(await reward("0.3", "0.30000000000000004")).toBe(1);
    expect(await reward("100000000000", "99999999999.99999")).toBe(1);
    expect(await reward("123456789012", "123456789012.00002")).toBe(1);
    expect(await reward("999999999999", "999999999999.4")).toBe(1);
    expect(await reward("4", "2.9999999999999")).toBe(0);
    // Integers stay exact at any size up to 1000 digits.
    expect(await reward("2432902008176640000", "2.43290200817664e18")).toBe(1);
    expect(await reward("2432902008176640000", "2432902008176640001")).toBe(0);
  });
});
