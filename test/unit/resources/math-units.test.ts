import { describe, expect, it } from "vitest";
import { MathVerifier } from "../../../participants/verifiers/index.js";

/**
 * docs/verifiers.md: a unit in a text wrapper (`\text{…}`, `\textrm`, `\mathrm`, `\mbox`) after a
 * number is ignored when only one side has a unit (the question names the unit; a data set's bare
 * `5` and a model's `5\text{ cm}` are the same answer), and compared when both have one (`5 cm` is
 * not `5 m`), their numbers as numbers (`5\text{ cm}` is `5.0\text{ cm}`). A plain-text suffix is
 * no unit: it cannot be told from a variable (`5 x`, `2 pi`); only the word degrees is one without
 * a wrapper.
 */
const reward = async (expected_answer: string, answer: string) => (await new MathVerifier().verify({ task: { expected_answer }, answer })).reward;

describe("math verifier: units", () => {
  it("accepts a number with a wrapped unit against the bare number, both ways", async () => {
    expect(await reward("5", "5\\text{ cm}")).toBe(1);
    expect(await reward("5", "\\boxed{5\\text{ cm}}")).toBe(1);
    expect(await reward("5", "$5\\,\\mathrm{cm}$.")).toBe(1);
    expect(await reward("0.5", "\\frac{1}{2}\\text{ m}")).toBe(1);
    expect(await reward("-3", "-3\\textrm{ degrees}")).toBe(1);
    expect(await reward("12", "12\\mbox{ km/h}")).toBe(1);
    expect(await reward("4", "4\\text{ m^2}")).toBe(1);
    expect(await reward("5\\text{ cm}", "5")).toBe(1);
    expect(await reward("5\\text{ cm}", "\\boxed{5}")).toBe(1);
  });

  it("compares the units when both sides have one, and the number always", async () => {
    expect(await reward("5\\text{ cm}", "5\\text{ m}")).toBe(0);
    expect(await reward("5\\text{ cm}", "5\\text{cm}")).toBe(1);
    expect(await reward("5 cm", "5\\text{cm}")).toBe(1);
    expect(await reward("5\\text{cm}", "5 cm")).toBe(1);
    expect(await reward("5 cm", "5\\text{ m}")).toBe(0);
    expect(await reward("5", "6\\text{ cm}")).toBe(0);
    expect(await reward("6\\text{ cm}", "5")).toBe(0);
  });

  it("takes no plain-text suffix, nothing but a number before the unit, and no upright constant for a unit", async () => {
    expect(await reward("5", "5 cm")).toBe(0);
    expect(await reward("5 cm", "5")).toBe(0);
    expect(await reward("5", "5x")).toBe(0);
    expect(await reward("2", "2 pi")).toBe(0);
    expect(await reward("5", "x = 5\\text{ cm}")).toBe(0);
    // A power right after the wrapper is the unit's (`5\\text{ cm}^2` is 5 cm²), anything else is not.
    expect(await reward("5", "5\\text{ cm}^2")).toBe(1);
    expect(await reward("5", "5\\text{ cm}^2 x")).toBe(0);
    expect(await reward("5", "5\\text{ or }7")).toBe(0);
    // A wrapper that hedges between answers is no unit, the other answer inside it or not.
    expect(await reward("5", "5\\text{ or 7}")).toBe(0);
    expect(await reward("5", "5\\text{ or seven}")).toBe(0);
    expect(await reward("5", "5\\text{ cm or 7 cm}")).toBe(0);
    expect(await reward("5\\text{ or 7}", "5")).toBe(0);
    // Joined by another word, or the other answer right after `or`: two answers still (they were a unit).
    expect(await reward("5", "5\\text{ and seven}")).toBe(0);
    expect(await reward("5", "5\\text{ nor seven}")).toBe(0);
    expect(await reward("5", "5\\text{ to seven}")).toBe(0);
    expect(await reward("5", "5\\text{ or7}")).toBe(0);
    expect(await reward("5\\text{ and seven}", "5")).toBe(0);
    expect(await reward("5", "5\\text{ tons}")).toBe(1);
    expect(await reward("5", "5\\text{ ton}")).toBe(1);
    expect(await reward("5", "5\\text{ m2}")).toBe(1);
    expect(await reward("5", "5\\text{ sq units}")).toBe(1);
    expect(await reward("50%", "50\\text{ cm}")).toBe(0);
    // Euler's number and the imaginary unit, set upright: 2e and 3i are not 2 and 3.
    expect(await reward("2", "2\\mathrm{e}")).toBe(0);
    expect(await reward("3", "3\\mathrm{i}")).toBe(0);
    // π written as a Unicode letter in a wrapper (unicode-math's upright π) is no unit either: 2π is not 2.
    expect(await reward("2", "2\\text{π}")).toBe(0);
    expect(await reward("2", "2\\mathrm{π}")).toBe(0);
  });

  it("takes degrees (`^\\circ`, `^{\\circ}`, `°`) as a unit: the bare number both ways, and one spelling of it", async () => {
    expect(await reward("90", "90^\\circ")).toBe(1);
    expect(await reward("90", "\\boxed{90^{\\circ}}")).toBe(1);
    expect(await reward("90", "$90^\\circ$.")).toBe(1);
    expect(await reward("90", "90°")).toBe(1);
    expect(await reward("45", "\\frac{90}{2}^\\circ")).toBe(1);
    expect(await reward("90^\\circ", "90")).toBe(1);
    expect(await reward("90^{\\circ}", "\\boxed{90}")).toBe(1);
    expect(await reward("90°", "90")).toBe(1);
    // Both sides with degrees, however spelled, compare as written: the same unit, and the number always.
    expect(await reward("90^\\circ", "90°")).toBe(1);
    expect(await reward("90^{\\circ}", "90 ^ \\circ")).toBe(1);
    expect(await reward("90^\\circ", "\\text{90°}")).toBe(1);
    expect(await reward("90", "91^\\circ")).toBe(0);
    expect(await reward("91^\\circ", "90")).toBe(0);
    // Another unit is not degrees; nor is anything after them, or an expression before them.
    expect(await reward("90^\\circ", "90\\text{ rad}")).toBe(0);
    expect(await reward("90", "90^\\circ 5")).toBe(0);
    expect(await reward("90", "x = 90^\\circ")).toBe(0);
    expect(await reward("90", "90^\\circle")).toBe(0);
  });

  it("reads `\\degree`, a `°` closing a text wrapper, and a wrapped `degree`/`degrees` as the degree sign", async () => {
    expect(await reward("90", "90\\degree")).toBe(1);
    expect(await reward("90\\degree", "90")).toBe(1);
    expect(await reward("90^\\circ", "\\boxed{90\\degree}")).toBe(1);
    expect(await reward("90", "\\text{90°}")).toBe(1);
    expect(await reward("\\text{90°}", "90")).toBe(1);
    expect(await reward("90", "90\\text{°}")).toBe(1);
    expect(await reward("90^\\circ", "90\\text{ degrees}")).toBe(1);
    expect(await reward("90\\text{ degree}", "90°")).toBe(1);
    expect(await reward("90", "90\\text{ degrees}")).toBe(1);
    // Still one spelling of one unit, after a number only, with nothing after it.
    expect(await reward("90", "90\\degrees")).toBe(0);
    expect(await reward("90", "91\\degree")).toBe(0);
    expect(await reward("90", "\\text{91°}")).toBe(0);
    expect(await reward("90", "\\text{x = 90°}")).toBe(0);
    expect(await reward("90", "\\text{90°} 5")).toBe(0);
    expect(await reward("90\\text{ degrees}", "90\\text{ rad}")).toBe(0);
  });

  it("reads a number and the word degrees in one text wrapper, and textcomp's `\\textdegree`, as degrees", async () => {
    expect(await reward("90", "\\text{90 degrees}")).toBe(1);
    expect(await reward("\\text{90 degrees}", "90")).toBe(1);
    expect(await reward("90^\\circ", "\\boxed{\\text{90 degree}}")).toBe(1);
    expect(await reward("\\text{90degrees}", "90°")).toBe(1);
    expect(await reward("90°", "90\\textdegree")).toBe(1);
    expect(await reward("90", "90\\textdegree")).toBe(1);
    expect(await reward("90\\textdegree{}", "90")).toBe(1);
    expect(await reward("90", "\\text{90\\textdegree}")).toBe(1);
    // Still a number with nothing after the unit; a word before degrees is no number, and `\\textdegrees` no degree sign.
    expect(await reward("90", "\\text{91 degrees}")).toBe(0);
    expect(await reward("90", "\\text{x = 90 degrees}")).toBe(0);
    expect(await reward("5", "5\\text{ in degrees}")).toBe(1);
    expect(await reward("90", "90\\textdegrees")).toBe(0);
    expect(await reward("90", "\\text{90 degrees} 5")).toBe(0);
  });

  it("takes degrees Celsius or Fahrenheit (`°C`, `^\\circ\\text{C}`) as one unit: the bare number both ways, another unit not", async () => {
    for (const celsius of ["90^\\circ\\text{C}", "90^{\\circ}\\mathrm{C}", "90\\,^\\circ\\mathrm{C}", "90°C", "90 ^\\circ C", "90\\text{°C}", "\\text{90°C}", "90\\textdegree C", "\\boxed{90^\\circ \\text{C}}"]) {
      expect(await reward("90", celsius), celsius).toBe(1);
      expect(await reward(celsius, "90"), celsius).toBe(1);
      expect(await reward(celsius, "90°C"), celsius).toBe(1);
      expect(await reward("91", celsius), celsius).toBe(0);
    }
    expect(await reward("212", "212^\\circ\\text{F}")).toBe(1);
    // Both sides with a unit compare the units: Celsius is neither Fahrenheit nor an angle's degrees.
    expect(await reward("90^\\circ\\text{C}", "90^\\circ\\text{F}")).toBe(0);
    expect(await reward("90^\\circ\\text{C}", "90^\\circ")).toBe(0);
    // Nothing may follow the unit, and only C or F after the degree sign is a temperature.
    expect(await reward("90", "90^\\circ\\text{C} 5")).toBe(0);
    expect(await reward("90", "90^\\circ\\text{Cx}")).toBe(0);
    expect(await reward("90", "90^\\circ x")).toBe(0);
  });

  /*
   * The unit word degrees after a number is a unit in plain text too (it is no variable, as `x` or
   * `pi` may be), and with Celsius or Fahrenheit after it is `°C` / `°F`; a number inside the text
   * wrapper, spacing before its unit (`\text{5 cm}`), is the number before a wrapped unit. Each row:
   * expected, answer, reward.
   */
  describe("a unit word after a number, plain or with the number in the wrapper", () => {
    it.each([
      // Plain-text degrees: the bare number and any spelling of degrees, both ways.
      ["90", "\\boxed{90 degrees}", 1],
      ["90^\\circ", "\\boxed{90 degrees}", 1],
      ["90 degrees", "90", 1],
      ["90 degrees", "90°", 1],
      ["90", "90 degree", 1],
      ["90", "90degrees", 1],
      ["90", "90 Degrees.", 1],
      ["-3", "-3 degrees", 1],
      ["\\text{90 degrees}", "90 degrees", 1],
      // The number closed by a `$` or a brace before the word (`$90$ degrees`, `\\text{90} degrees`, a fraction): still right after it.
      ["90", "$90$ degrees", 1],
      ["90°", "$90$ degrees", 1],
      ["$90$ degrees", "90", 1],
      ["90^\\circ", "$90$ degrees", 1],
      ["90", "\\text{90} degrees", 1],
      ["90°", "\\text{90} degrees", 1],
      ["\\text{90} degrees", "90", 1],
      ["0.5", "\\frac{1}{2} degrees", 1],
      ["\\frac{1}{2}^\\circ", "\\frac{1}{2} degrees", 1],
      ["0.5", "$\\frac{1}{2}$ degrees", 1],
      ["90°C", "$90$ degrees Celsius", 1],
      // LaTeX's spacing, or an escaped `$`, there: what normalizing reads as spacing or `$`, the unit check too.
      ["90", "90\\,degrees", 1],
      ["90", "90\\ degrees", 1],
      ["90", "\\text{90}\\,degrees", 1],
      ["90", "\\$90\\$ degrees", 1],
      ["90°", "\\$90\\$ degrees", 1],
      ["91", "$90$ degrees", 0],
      ["90", "$90^\\circ$ degrees", 0],
      ["90", "$x$ degrees", 0],
      ["90", "\\text{x} degrees", 0],
      ["90", "\\text{90 cm} degrees", 0],
      // Degrees Celsius or Fahrenheit, spelled out, plain or wrapped: °C / °F.
      ["90", "\\text{90 degrees Celsius}", 1],
      ["\\text{90 degrees Celsius}", "90", 1],
      ["90^\\circ\\text{C}", "\\text{90 degrees Celsius}", 1],
      ["90°C", "90\\text{ degrees Celsius}", 1],
      ["90°C", "90 degrees celsius", 1],
      ["90°C", "\\text{90 degrees C}", 1],
      ["212", "212 degrees Fahrenheit", 1],
      ["212^\\circ\\text{F}", "\\mathrm{212 degrees Fahrenheit}", 1],
      // The number inside the wrapper, spacing (plain or LaTeX's) before the unit.
      ["5", "\\text{5 cm}", 1],
      ["\\text{5 cm}", "5", 1],
      ["5\\text{ cm}", "\\text{5 cm}", 1],
      ["5", "\\boxed{\\mathrm{5 km/h}}", 1],
      ["5", "\\text{5\\,cm}", 1],
      ["4", "\\text{4 m^2}", 1],
      ["1000", "\\text{1,000 m}", 1],
      ["-2.5", "\\mbox{-2.5 m}", 1],
      // Near-misses. Hedges between answers stay two answers, with the unit plain or wrapped.
      ["90", "90 or 45 degrees", 0],
      ["45", "90 or 45 degrees", 0],
      ["90", "\\text{90 or 45 degrees}", 0],
      ["90", "90 to 100 degrees", 0],
      ["90", "$90$ or $45$ degrees", 0],
      ["45", "$90$ or $45$ degrees", 0],
      ["45", "\\text{90 or 45} degrees", 0],
      ["5", "\\text{5 or 7}", 0],
      ["5", "\\text{5 or seven}", 0],
      ["5", "\\text{5 and 7 cm}", 0],
      ["5", "\\text{5 cm or 7 cm}", 0],
      ["5\\text{ or 7}", "\\text{5 or 7}", 1],
      // Another number, another unit, a word before or anything after: as with a wrapped unit.
      ["90", "91 degrees", 0],
      ["90", "x = 90 degrees", 0],
      ["90", "90 degrees 5", 0],
      ["90", "90 degrees Kelvin", 0],
      ["90^\\circ", "90 degrees Celsius", 0],
      ["90 degrees Celsius", "90 degrees Fahrenheit", 0],
      ["90", "\\text{90 degrees Celsius} 5", 0],
      ["5", "\\text{x 5 cm}", 0],
      ["5", "\\text{6 cm}", 0],
      ["5\\text{ m}", "\\text{5 cm}", 0],
      // Other plain-text units stay text (a variable or a constant cannot be told from one): the documented rule.
      ["5", "5 cm", 0],
      ["5", "5 cm^2", 0],
      ["2", "2 pi", 0],
      // A wrapped unit with a power is a unit (as `4\\text{ m^2}`), the power inside the wrapper or right after it.
      ["5", "\\text{5 cm^2}", 1],
      ["5", "\\text{5 cm}^2", 1],
      // Upright constants stay no unit, and a number glued to letters in a wrapper is read as written (`2e5` is 200000).
      ["2", "\\text{2 e}", 0],
      ["3", "\\mathrm{3 i}", 0],
      ["2", "\\text{2 π}", 0],
      ["2", "\\text{2e5}", 0],
      ["200000", "\\text{2e5}", 1],
      // An exponent after spacing is no unit either: `1.5\\text{ e3}` is `1.5 e3`, 1500 (spaces removed, as in plain text), never also 1.5.
      ["1.5", "1.5\\text{ e3}", 0],
      ["1500", "1.5\\text{ e3}", 1],
      ["1.5", "\\text{1.5 e3}", 0],
      ["1500", "\\text{1.5 e3}", 1],
      ["1.5", "1.5\\text{e3}", 0],
      ["1500", "1.5\\text{e3}", 1],
      ["1.5", "1.5\\mathrm{ E3}", 0],
      ["1500", "1.5\\mathrm{ E3}", 1],
      ["1.5", "1.5\\text{ e-3}", 0],
      ["0.0015", "1.5\\text{ e-3}", 1],
      ["1.5\\text{ e3}", "1.5", 0],
      ["1.5\\text{ e3}", "1500", 1],
      ["1.5 e3", "1.5\\text{ e3}", 1],
      ["5", "5\\text{ em}", 1],
    ] as const)("expected %s, answer %s: reward %i", async (expected, answer, expectedReward) => {
      expect(await reward(expected, answer)).toBe(expectedReward);
    });
  });

  /*
   * Both sides with a unit: the numbers compared by the rules of bare numbers (12 significant
   * digits, fractions, thousands separators, integers exactly), the units as normalized (spacing
   * and wrappers, every spelling of degrees read as `°`); no unit is converted. Each row: expected,
   * answer, reward.
   */
  describe("both sides with a unit: the numbers as numbers, the units as one unit", () => {
    it.each([
      ["5\\text{ cm}", "5.0\\text{ cm}", 1],
      ["90^\\circ", "90.0^\\circ", 1],
      ["45^\\circ", "\\frac{90}{2}^\\circ", 1],
      ["0.5\\text{ m}", "\\frac{1}{2}\\text{ m}", 1],
      ["-0.5\\text{ m}", "-\\frac{1}{2}\\text{ m}", 1],
      ["5\\text{ cm}", "\\text{5.0 cm}", 1],
      ["\\text{5 cm}", "\\boxed{5.00\\text{cm}}", 1],
      ["1000\\text{ m}", "1,000\\text{ m}", 1],
      ["1000\\text{ m}", "\\text{1,000 m}", 1],
      ["2.5e3\\text{ m}", "2500\\text{ m}", 1],
      ["0.3\\text{ m}", "0.30000000000000004\\text{ m}", 1],
      ["12\\text{ km/h}", "12.0\\,\\mathrm{km/h}", 1],
      ["4\\text{ m^2}", "4.0\\text{ m^2}", 1],
      ["90^\\circ", "\\frac{180}{2}\\text{ degrees}", 1],
      ["$90$ degrees", "90.0^\\circ", 1],
      ["90^\\circ\\text{C}", "90.0°C", 1],
      ["90°F", "90.0 degrees Fahrenheit", 1],
      // Kept: one side's unit against a bare number, an exponent no unit (`1.5\\text{ e3}` is 1500).
      ["1.5\\text{ e3}", "1500\\text{ m}", 1],
      ["5.0", "5\\text{ cm}", 1],
      // Near-misses: another unit (no conversion), another number, a unit followed by a power, a hedge.
      ["5\\text{ cm}", "5.0\\text{ m}", 0],
      ["5\\text{ cm}", "0.05\\text{ m}", 0],
      ["5\\text{ cm}", "5.1\\text{ cm}", 0],
      ["5\\text{ cm}", "-5\\text{ cm}", 0],
      ["5\\text{ cm}^2", "5\\text{ cm}", 0],
      ["5\\text{ cm}", "5.0\\text{ cm}^2", 0],
      ["5\\text{ cm}", "5.0\\text{ cm^2}", 0],
      ["90^\\circ\\text{C}", "90.0^\\circ\\text{F}", 0],
      ["90^\\circ", "90.0^\\circ\\text{C}", 0],
      ["90^\\circ", "90.0\\text{ rad}", 0],
      ["2432902008176640000\\text{ m}", "2432902008176640000.5\\text{ m}", 0],
      ["5\\text{ cm}", "5.0\\text{ or 7 cm}", 0],
      ["5\\text{ cm}", "5.0\\mathrm{e}", 0],
      ["1.5\\text{ e3}", "1.5\\text{ cm}", 0],
      ["x = 5\\text{ cm}", "5.0\\text{ cm}", 0],
      ["50\\%", "50\\text{ cm}", 0],
    ] as const)("expected %s, answer %s: reward %i", async (expected, answer, expectedReward) => {
      expect(await reward(expected, answer)).toBe(expectedReward);
    });

    it("still refuses an expected answer dividing by zero before a unit", async () => {
      await expect(reward("1/0\\text{ m}", "1/0.0\\text{ m}")).rejects.toThrow(/divides by zero/);
      await expect(reward("\\frac{1}{0}^\\circ", "\\frac{1}{0}^\\circ")).rejects.toThrow(/divides by zero/);
    });
  });

  it("finds the unit in linear time on long answers (a guard against backtracking, not a speed target)", { timeout: 10_000 }, async () => {
    const started = performance.now();
    expect(await reward("5", "\\text{".repeat(14_000))).toBe(0);
    expect(await reward("5", `5\\text{${"a ".repeat(49_000)}}`)).toBe(1);
    expect(await reward("5", `${"\\mbox{x}".repeat(11_000)}`)).toBe(0);
    expect(await reward("5", `5${"^ { ".repeat(24_000)}`)).toBe(0);
    expect(await reward("5", `\\text{${"° ".repeat(49_000)}x`)).toBe(0);
    expect(await reward("5", `${"\\text{ ".repeat(14_000)}`)).toBe(0);
    expect(await reward("5", `\\text{${"degree".repeat(16_000)}}`)).toBe(0);
    expect(await reward("5", `5°${" ".repeat(99_000)}x`)).toBe(0);
    expect(await reward("5", `${"9 ".repeat(49_000)}degrees x`)).toBe(0);
    expect(await reward("5", `${"9degrees".repeat(12_000)}`)).toBe(0);
    expect(await reward("5", `5${"} $".repeat(33_000)}degrees`)).toBe(0);
    expect(await reward("5", `\\text{${"5 ".repeat(49_000)}cm}`)).toBe(0);
    expect(await reward(`5\\text{${"a ".repeat(4_900)}}`, `5.0\\text{${"a ".repeat(49_000)}}`)).toBe(0);
    expect(await reward(`\\text{5 ${"a ".repeat(4_900)}}`, `\\text{5.0 ${"a ".repeat(49_000)}}`)).toBe(0);
    expect(performance.now() - started).toBeLessThan(2_000);
  });
});
