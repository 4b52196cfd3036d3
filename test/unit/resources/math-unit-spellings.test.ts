import { describe, expect, it } from "vitest";
import { MathVerifier } from "../../../participants/verifiers/index.js";

/**
 * docs/verifiers.md: two sides with a unit are equal when their numbers are and their units are one
 * unit. A unit symbol's case is its meaning (SI prefixes: `Mm` is megametres, `mm` millimetres;
 * `GB` bytes, `Gb` bits), so it is compared with case, except a capitalised word (`Meters`) and the
 * litre's two symbols (`mL`, `ml`). A power has several spellings (`m2`, `m^2`, `m^{2}`,
 * `\text{m}^2`, `m²`), all one unit; no unit is converted. An exponent marker in a wrapper is no
 * unit, with digits (`1.5\text{ e3}` is 1500) or without (`2\text{ E}` is not 2). Each row:
 * expected, answer, reward.
 */
const reward = async (expected_answer: string, answer: string) => (await new MathVerifier().verify({ task: { expected_answer }, answer })).reward;

describe("math verifier: a unit's case", () => {
  it.each([
    // SI prefixes differ by case: never one unit.
    ["5\\text{ Mm}", "5\\text{ mm}", 0],
    ["5\\text{ mm}", "5\\text{ Mm}", 0],
    ["3\\text{ MHz}", "3\\text{ mHz}", 0],
    ["2\\text{ GB}", "2\\text{ Gb}", 0],
    ["4\\text{ Pg}", "\\text{4 pg}", 0],
    ["5\\,\\mathrm{Mm}", "\\boxed{5\\text{ mm}}", 0],
    // Nor against the same spelling as plain text: its case is the unit's.
    ["5\\text{ Mm}", "5 mm", 0],
    ["5 mm", "5\\text{ Mm}", 0],
    // An all-capitals spelling is another symbol too (`CM` is no centimetre).
    ["5\\text{ cm}", "5\\text{ CM}", 0],
    // Same case: one unit, plain or wrapped, the number compared as a number (its exponent's `E` is any case).
    ["5\\text{ Mm}", "5.0\\text{ Mm}", 1],
    ["5\\text{ mm}", "5 mm", 1],
    ["2.5E3\\text{ m}", "2.5e3 m", 1],
    // A capitalised word is the word, and the litre has two symbols.
    ["5\\text{ Meters}", "5\\text{ meters}", 1],
    // Word by word: a title-cased unit of several words is those words, and symbols spaced apart stay symbols (`N mol`, newton moles, is no `nmol`).
    ["5\\text{ square units}", "5\\text{ Square Units}", 1],
    ["5\\,\\mathrm{Square Meters}", "5\\text{ square meters}", 1],
    ["5\\text{ Square Units}", "5 square units", 1],
    ["5\\text{ N mol}", "5\\text{ nmol}", 0],
    ["5\\text{ Tons}", "5 tons", 1],
    ["5\\text{ mL}", "5\\text{ ml}", 1],
    ["2\\text{ L}", "\\text{2 l}", 1],
    ["2\\text{ L}", "2\\text{ mL}", 0],
    // `K` is no SI prefix: before another symbol it is kilo's miswriting (`Km`, `Kg`, `KJ`), alone it is kelvin.
    ["5\\text{ km}", "5\\text{ Km}", 1],
    ["5\\text{ Kg}", "5\\text{ kg}", 1],
    ["5\\text{ km}", "5 Km", 1],
    ["3\\text{ kJ}", "3\\,\\mathrm{KJ}", 1],
    ["2\\text{ kB}", "2\\text{ KB}", 1],
    ["2\\text{ KB}", "2\\text{ Kb}", 0],
    ["5\\text{ K}", "5\\text{ k}", 0],
    ["5\\text{ Km}", "5\\text{ Mm}", 0],
    // Degrees Celsius or Fahrenheit have no other meaning in lower case.
    ["90^\\circ\\text{C}", "90^\\circ c", 1],
    ["90°F", "90\\text{°f}", 1],
    // One side's unit against the bare number is still ignored.
    ["5", "5\\text{ Mm}", 1],
    ["5\\text{ Mm}", "5", 1],
  ] as const)("expected %s, answer %s: reward %i", async (expected, answer, expectedReward) => {
    expect(await reward(expected, answer)).toBe(expectedReward);
  });
});

describe("math verifier: an exponent marker without digits is no unit", () => {
  it.each([
    ["2", "2\\text{ E}", 0],
    ["2\\text{ E}", "2", 0],
    ["2", "2\\mathrm{E}", 0],
    ["2", "\\text{2 E}", 0],
    ["2", "2\\text{ E-}", 0],
    ["2", "2\\text{ e}", 0],
    // Read as written, it equals only the same text.
    ["2\\text{ E}", "2\\text{E}", 1],
    // With digits it is an exponent: `1.5\text{ E3}` is 1500.
    ["1500", "1.5\\text{ E3}", 1],
  ] as const)("expected %s, answer %s: reward %i", async (expected, answer, expectedReward) => {
    expect(await reward(expected, answer)).toBe(expectedReward);
  });
});

describe("math verifier: an upright constant or an exponent marker with a power is no unit", () => {
  it.each([
    // 2e² is about 14.78, 3i² is -3: neither is 2 or 3 in a unit.
    ["2", "2\\mathrm{e}^2", 0],
    ["2", "2\\,\\mathrm{e}^{-1}", 0],
    ["2", "2\\mathrm{e}²", 0],
    ["2", "2\\mathrm{e^2}", 0],
    ["2", "\\text{2 e}^2", 0],
    ["3", "3\\mathrm{i}^2", 0],
    ["2", "2\\text{π}^2", 0],
    ["2", "2\\text{ E}^2", 0],
    ["2\\mathrm{e}^2", "2", 0],
    // Read as written, it equals the same text.
    ["2\\mathrm{e}^2", "2e^2", 1],
  ] as const)("expected %s, answer %s: reward %i", async (expected, answer, expectedReward) => {
    expect(await reward(expected, answer)).toBe(expectedReward);
  });
});

describe("math verifier: a unit's powers however written", () => {
  it.each([
    ["5\\text{ m^2}", "5\\text{ m2}", 1],
    ["5\\text{ m2}", "5\\text{ m^2}", 1],
    ["5\\text{ m^2}", "5\\,\\mathrm{m^{2}}", 1],
    ["5\\text{ m^2}", "5\\text{ m}^2", 1],
    ["5\\text{ m2}", "5\\,\\mathrm{m}^{2}", 1],
    ["5\\text{ m^2}", "5\\text{ m²}", 1],
    ["\\text{5 m2}", "\\text{5 m}^2", 1],
    ["9.8\\text{ m/s^2}", "9.8\\,\\mathrm{m/s}^2", 1],
    ["3\\text{ s^{-1}}", "3\\text{ s⁻¹}", 1],
    ["3\\text{ s^{-1}}", "3\\text{ s}^{-1}", 1],
    ["12\\text{ cm³}", "12\\text{ cm^3}", 1],
    // A wrapped unit with its power against the bare number: the unit ignored, as any.
    ["5", "5\\text{ m}^2", 1],
    // Spacing after the caret is LaTeX's, no part of the power: `^ 2` is `^2`.
    ["5", "5\\text{ m}^ 2", 1],
    ["5", "5\\,\\mathrm{s}^ {-1}", 1],
    ["5\\text{ m^2}", "5\\text{ m}^ 2", 1],
    ["5", "5\\,\\mathrm{m^{2}}", 1],
    ["5", "5\\text{ m²}", 1],
    ["5\\text{ cm}^2", "5", 1],
    // No conversion, and another power is another unit.
    ["5\\text{ m^2}", "5\\text{ m^3}", 0],
    ["5\\text{ m2}", "5\\text{ m}", 0],
    ["5\\text{ cm}^2", "5\\text{ cm}", 0],
    ["5\\text{ m^2}", "5\\text{ M^2}", 0],
    ["5\\text{ m^2}", "6\\text{ m}^2", 0],
    // A power followed by anything, or a power of nothing, is no unit.
    ["5", "5\\text{ m}^23", 0],
    ["5", "5\\text{ m}^2 x", 0],
    ["5", "5\\text{ m}^{x}", 0],
  ] as const)("expected %s, answer %s: reward %i", async (expected, answer, expectedReward) => {
    expect(await reward(expected, answer)).toBe(expectedReward);
  });
});

/**
 * Long inputs built to make each pattern of a unit's spelling backtrack: braced and bare powers,
 * Unicode superscripts, a power after the wrapper, letters' case, words, the wrapper itself. Each
 * takes the length to fill.
 */
const PATHOLOGICAL: Record<string, (length: number) => string> = {
  carets: (n) => `5\\text{ m${"^".repeat(n)}`,
  caretAfterLetters: (n) => `5\\text{${"a^".repeat(n / 2)}`,
  bracedPowers: (n) => `5\\text{ m${"^{1}".repeat(n / 4)}x`,
  unclosedBracedPowers: (n) => `5\\text{ m${"^{-1".repeat(n / 4)}}`,
  wrapperOpenings: (n) => "\\text{".repeat(n / 6),
  wrappersWithCarets: (n) => "\\text{m}^{1".repeat(n / 11),
  spacingAfterCaret: (n) => `5\\text{ m}^${" ".repeat(n)}x`,
  superscriptsAfterWrapper: (n) => `5\\text{ m}${"⁻²".repeat(n / 2)}x`,
  superscriptsInWrapper: (n) => `5\\text{ m${"⁻²".repeat(n / 2)}}`,
  bareDigits: (n) => `5\\text{ ${"Mm2".repeat(n / 3)}}`,
  casedLetters: (n) => `5\\text{ ${"Mmmm".repeat(n / 4)}}`,
  casedWords: (n) => `5\\text{ ${"Mm ".repeat(n / 3)}}`,
  constantWithPowers: (n) => `2\\mathrm{e${"^2".repeat(n / 2)}}`,
  miswrittenKilos: (n) => `5\\text{ ${"Km ".repeat(n / 3)}}`,
  degreeScales: (n) => `5\\text{ ${"°c".repeat(n / 2)}}`,
};

/** Milliseconds `run` takes, the least of three runs (the others paid for warm-up or a pause). */
function leastTime(run: () => void): number {
  let least = Infinity;
  for (let attempt = 0; attempt < 3; attempt += 1) {
    const started = performance.now();
    run();
    least = Math.min(least, performance.now() - started);
  }
  return least;
}

describe("math verifier: unit spellings on long answers", () => {
  // Linear time: one input of the longest length costs about what a hundred of a hundredth of it
  // cost (a pattern that backtracks costs a hundred times that, or far more); measured against each
  // other in the same run, not against a speed target. The bound leaves room for allocation, which
  // makes the longest inputs cost up to ~10× their parts in a loaded, shared worker.
  it.each([
    ["answer", 100_000],
    ["expected answer", 10_000],
  ] as const)("reads the %s's unit in linear time up to its length limit (%i characters)", { timeout: 60_000 }, async (side, limit) => {
    const verifier = new MathVerifier();
    const judge = (text: string) => {
      const body = side === "answer" ? { task: { expected_answer: "5\\text{ mm}" }, answer: text } : { task: { expected_answer: text }, answer: "5\\text{ mm}" };
      verifier.verify(body).catch(() => undefined);
    };
    for (const [name, build] of Object.entries(PATHOLOGICAL)) {
      // Room for what each input opens and closes with.
      const whole = build(limit - 100);
      const part = build((limit - 100) / 100);
      expect(whole.length, name).toBeLessThanOrEqual(limit);
      const wholeTime = leastTime(() => judge(whole));
      const partsTime = leastTime(() => {
        for (let i = 0; i < 100; i += 1) judge(part);
      });
      expect(wholeTime, `${name}: ${wholeTime.toFixed(1)} ms for the whole, ${partsTime.toFixed(1)} ms for a hundred hundredths`).toBeLessThan(30 * partsTime + 1);
    }
  });
});
