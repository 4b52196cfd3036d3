import { describe, expect, it } from "vitest";
import { MathVerifier, normalizeAnswer } from "../../../participants/verifiers/index.js";

/**
 * docs/verifiers.md: integers are compared exactly, other numbers to 12 significant digits, never
 * coarser than their first decimal. At 12 significant digits alone a large non-integer lost integer
 * digits: 20! + 0.5 read as 2432902008180000000, equal to that integer (3,359,999.5 away) and to any
 * non-integer as far off, while 20! itself (0.5 away) was not. Floating-point noise
 * (`2.9999999999999`, `0.30000000000000004`) must still equal its value.
 */
const reward = async (expected_answer: string, answer: string) => (await new MathVerifier().verify({ task: { expected_answer }, answer })).reward;

describe("math verifier: rounding a large non-integer", () => {
  it("never rounds an integer digit away: large-magnitude mismatches are refused", async () => {
    expect(await reward("2432902008180000000", "2432902008176640000.5")).toBe(0);
    expect(await reward("2432902008176640000.5", "\\boxed{2432902008180000000}")).toBe(0);
    expect(await reward("2432902008176640000", "2432902008176640000.5")).toBe(0);
    expect(await reward("2432902008176640001", "2432902008176640000.5")).toBe(0);
    expect(await reward("2432902008180000000.5", "2432902008176640000.5")).toBe(0);
    expect(await reward("2432902008176640000.5", "2432902008176640000.7")).toBe(0);
    // An inexact quotient too: 10^20 / 3 is no integer, nor 33333333333300000000.5.
    expect(await reward("100000000000000000000/3", "33333333333300000000")).toBe(0);
    expect(await reward("100000000000000000000/3", "33333333333300000000.3")).toBe(0);
    expect(await reward("1000000000000", "999999999999.5")).toBe(0);
    expect(await reward("999999999999", "999999999999.4")).toBe(0);
    expect(normalizeAnswer("2432902008176640000.5")).toBe("2432902008176640000.5");
    expect(normalizeAnswer("100000000000000000000/3")).toBe("33333333333333333333.3");
  });

  it("compares such a number to its first decimal", async () => {
    expect(await reward("100000000000000000000/3", "33333333333333333333.33")).toBe(1);
    expect(await reward("2432902008176640000.5", "2432902008176640000.50000001")).toBe(1);
    // Rounded to an integer, it equals that integer: within 0.05.
    expect(await reward("123456789012", "123456789012.00002")).toBe(1);
    expect(await reward("2432902008176640000", "2432902008176640000.04")).toBe(1);
  });

  it("keeps floating-point noise equal: 12 significant digits below 10^11", async () => {
    expect(await reward("3", "2.9999999999999")).toBe(1);
    expect(await reward("0.3", "0.30000000000000004")).toBe(1);
    expect(await reward("100", "99.99999999999999")).toBe(1);
    expect(await reward("100000000000", "99999999999.99999")).toBe(1);
    expect(await reward("1/3", "0.333333333333333")).toBe(1);
    expect(await reward("4", "2.9999999999999")).toBe(0);
    // Integers stay exact at any size up to 1000 digits.
    expect(await reward("2432902008176640000", "2.43290200817664e18")).toBe(1);
    expect(await reward("2432902008176640000", "2432902008176640001")).toBe(0);
  });

  it("reads a long non-integer in one pass (no BigInt written back)", { timeout: 10_000 }, () => {
    const started = performance.now();
    expect(normalizeAnswer(`${"9".repeat(99_990)}.96`)).toBe("1e+99990");
    expect(normalizeAnswer(`${"1".repeat(99_990)}.25`)).toBe(`1.${"1".repeat(99_989)}3e+99989`);
    expect(performance.now() - started).toBeLessThan(2_000);
  });
});
