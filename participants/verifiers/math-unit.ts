/**
 * One unit's spellings, for the math verifier: which written units are one unit. Nothing is
 * converted (`cm` is never `0.01 m`); only ways of writing the same symbols are made one.
 *
 * Runs on answers a model wrote, in the verifier's only thread: no pattern here may backtrack over
 * its input (see math-verifier.ts).
 */

/** Unicode's superscript digits and minus, as written after a unit (`m²`, `s⁻¹`). */
const SUPERSCRIPT_CHARS: Record<string, string> = {
  "⁰": "0", "¹": "1", "²": "2", "³": "3", "⁴": "4", "⁵": "5", "⁶": "6", "⁷": "7", "⁸": "8", "⁹": "9", "⁻": "-",
};
const SUPERSCRIPT_POWER = /⁻?[⁰¹²³⁴⁵⁶⁷⁸⁹]+/g;
/** A braced power, `^{2}`, `^{-1}` (spacing allowed). */
const BRACED_POWER = /\^\s*\{\s*(-?\d+)\s*\}/g;
/** A letter followed by digits with no `^` between: `m2` is `m^2`. */
const BARE_POWER = /(\p{L})(\d+)/gu;
/**
 * The source of the power that may come right after a unit's text wrapper (`\text{ m}^2`,
 * `\mathrm{m}^{-1}`, `\text{ m}²`): one digit without braces (`^23` is `^2` then a 3), any integer
 * with them, or Unicode superscripts.
 */
export const POWER_AFTER_WRAPPER_SOURCE = String.raw`\^\s*(?:\d|\{\s*-?\d+\s*\})|⁻?[⁰¹²³⁴⁵⁶⁷⁸⁹]+`;

/** A run of letters whose case is no meaning: a capitalised word (`Meters`, `Tons`), four letters or more. */
const CAPITALISED_WORD = /^\p{Lu}\p{Ll}{3,}$/u;
/**
 * The litre, which has two symbols, `l` and `L`, with any SI prefix (`ml`, `mL`): read as `L`.
 * Every other symbol's case is its meaning: SI prefixes (`Mm` megametres, `mm` millimetres), `B`
 * bytes and `b` bits, `K` kelvin; so is an all-capitals spelling (`CM` is no centimetre).
 */
const LITRE = /^([yzafpnuµmcdhkMGTPEZY]?)[lL]$/u;
/**
 * A capital `K` opening a run of symbols (`Km`, `Kg`, `KJ`, `KB`): `K` is no SI prefix, so there it
 * is kilo's `k` miswritten; alone it is kelvin and keeps its case.
 */
const KILO_MISWRITTEN = /^K(?=\p{L})/u;
/** The degree sign before a lower-case `c` or `f` and no other letter (`°c`): degrees Celsius or Fahrenheit, no other meaning. */
const LOWER_DEGREE_SCALE = /°([cf])(?!\p{L})/gu;

/**
 * `unit`'s powers written one way, `^2`, `^-1`: braced (`m^{2}`) or Unicode superscripts (`m²`,
 * `s⁻¹`). A letter's bare digits (`m2`) are left as written: splitUnit checks this spelling
 * against its unit rule, which reads them already.
 */
export function powersWithCaret(unit: string): string {
  return unit
    .replace(BRACED_POWER, "^$1")
    .replace(SUPERSCRIPT_POWER, (power) => "^" + [...power].map((char) => SUPERSCRIPT_CHARS[char]).join(""));
}

/**
 * A unit (LaTeX already read as plain text, its spacing kept) as one spelling, so two units are one
 * unit when these are equal: every power `^n` (`m2`, `m^{2}`, `m²` are `m^2`), a capitalised word
 * in lower case, the litre as `L`, and every other letter's case kept (caseOfUnitLetters), then
 * spacing removed. Letters are judged word by word as written: `Square Units` is `square units`,
 * while `N mol` (newton moles) stays apart from `nmol`, though both lose their spacing.
 */
export function canonicalUnit(plainUnit: string): string {
  return degreeScaleInCapitals(powersWithCaret(caseOfUnitLetters(plainUnit).replace(/\s+/g, "")).replace(BARE_POWER, "$1^$2"));
}

/**
 * `text`, the unit `plainUnit` with its spacing removed or a text equal to that but for case, with
 * each of `plainUnit`'s words as caseOfUnitLetters reads it: the words of a text that lost its
 * spacing (a plain-text answer once normalized) are where the unit's are.
 */
export function caseOfUnitWords(plainUnit: string, text: string): string {
  let at = 0;
  let cased = "";
  for (const word of plainUnit.split(/\s+/)) {
    cased += caseOfUnitLetters(text.slice(at, at + word.length));
    at += word.length;
  }
  return degreeScaleInCapitals(cased + text.slice(at));
}

/** `text` (spacing removed) with degrees Celsius or Fahrenheit written `°C`, `°F` (LOWER_DEGREE_SCALE). */
function degreeScaleInCapitals(text: string): string {
  return text.replace(LOWER_DEGREE_SCALE, (_sign: string, scale: string) => `°${scale.toUpperCase()}`);
}

/**
 * `text` with each run of letters as a unit's letters compare: a capitalised word lower-cased, a
 * miswritten kilo's `K` as `k`, the litre `L`, the rest kept.
 */
export function caseOfUnitLetters(text: string): string {
  return text.replace(/\p{L}+/gu, (letters) => {
    if (CAPITALISED_WORD.test(letters)) return letters.toLowerCase();
    const symbols = letters.replace(KILO_MISWRITTEN, "k");
    const litre = LITRE.exec(symbols);
    return litre ? `${litre[1]}L` : symbols;
  });
}
