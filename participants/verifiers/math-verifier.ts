import { z } from "zod";
import { CheckpointError, type JsonValue } from "../../protocol/index.js";
import { POWER_AFTER_WRAPPER_SOURCE, canonicalUnit, caseOfUnitWords, powersWithCaret } from "./math-unit.js";
import { VerifierServer, parseVerifierBody, verifierTaskSchema, type VerifyResult } from "./verifier-server.js";

const MathTaskSchema = verifierTaskSchema({ expected_answer: z.string().max(10_000) });
const MathVerifyBodySchema = z.object({ task: MathTaskSchema, answer: z.string().max(100_000) }).strict();
/** A seed's task, checked as `/verify` checks it (under the same field names). */
const MathSeedTaskSchema = z.object({ task: MathTaskSchema }).strict();

/**
 * The final answer of a response: the last \boxed{...} if any (spacing may come before its brace:
 * `\boxed {5}`), else the whole text. A response with no braced \boxed may end with one that takes
 * the token after it, as in LaTeX (`\boxed 5`, `\boxed5`), up to spacing or a `$` (`$\boxed 42$` is
 * 42, as models mean it); the last such token is then the answer. A braced one always wins, so prose
 * mentioning "\boxed to mark it" after `\boxed{5}` leaves the answer 5.
 */
export function extractAnswer(text: string): string {
  const marker = "\\boxed";
  let unbraced: string | undefined;
  // Backwards over the markers: each skips only the spacing up to the next marker's backslash, so the scan stays linear.
  for (let at = text.lastIndexOf(marker); at !== -1; at = at === 0 ? -1 : text.lastIndexOf(marker, at - 1)) {
    let open = at + marker.length;
    // A letter goes on the macro's name: `\boxedx` is another macro.
    if (/\p{L}/u.test(text[open] ?? "")) continue;
    while (open < text.length && /\s/.test(text[open]!)) open += 1;
    if (text[open] !== "{") {
      if (unbraced === undefined) {
        // Sticky, on the text itself: no copy per marker.
        const token = /[^\s${}]+/y;
        token.lastIndex = open;
        unbraced = token.exec(text)?.[0];
      }
      continue;
    }
    let depth = 1;
    for (let i = open + 1; i < text.length; i += 1) {
      if (text[i] === "{") depth += 1;
      else if (text[i] === "}" && --depth === 0) return text.slice(open + 1, i);
    }
    return text;
  }
  return unbraced ?? text;
}

/** Longest integer compared digit for digit; a longer one falls back to the 12-significant-digit rule. */
const MAX_EXACT_DIGITS = 1000;
/** Significant digits other numbers are compared to (never coarser than their first decimal). */
const SIGNIFICANT_DIGITS = 12;
/** Longest fraction term computed with; a longer fraction is compared as text. */
const MAX_FRACTION_DIGITS = 10_000;

/*
 * Everything here runs on answers a model wrote (up to 100,000 characters) in the verifier's only
 * thread, which also answers the checkpoint control plane: no pattern may backtrack over its input
 * (each regex below is anchored with no two adjacent parts matching the same characters), and no
 * number goes through a double (1e-400 would be 0, 1e1001 Infinity, a fraction of huge terms NaN).
 */

/** A decimal literal: sign, integer digits, fraction digits, exponent (at least one digit overall). */
const DECIMAL = /^([-+]?)(\d*)(?:\.(\d*))?(?:[eE]([-+]?\d+))?$/;

/**
 * Normalizes an answer: spacing, `$`, a trailing period, thousands separators, numbers and
 * fractions. Integers (also `2.5e3`, `4/2`) are compared exactly, digit for digit — as doubles,
 * 20! + 1 would equal 20! — and other numbers to 12 significant digits (never coarser than their
 * first decimal), in decimal arithmetic.
 */
export function normalizeAnswer(text: string): string {
  return normalizedKeepingCase(text).toLowerCase();
}

/** normalizeAnswer's text before case is ignored (numbers come out as normalizeAnswer writes them). */
function normalizedKeepingCase(text: string): string {
  const spaced = plainDegreeWord(stripDecoration(latexPlain(extractAnswer(text))));
  let value = spaced.replace(/\s+/g, "");
  // A percentage compares its number as a number, and stays a percentage (50% is neither 50 nor 0.5).
  const percent = value.length > 1 && value.endsWith("%") ? "%" : "";
  if (percent) value = value.slice(0, -1);
  // A leading group of zeros is no thousands grouping ("0,001" read as 1 is a decimal comma's 0.001),
  // nor is a comma followed by spacing, which separates list items ("2, 345" is two numbers, not 2345).
  if (/^-?[1-9]\d{0,2}(,\d{3})+(\.\d+)?$/.test(value) && !/,\s/.test(spaced)) value = value.replace(/,/g, "");
  const fraction = fractionTerms(value);
  const quotient = fraction ? canonicalQuotient(fraction[0]!, fraction[1]!) : undefined;
  if (quotient !== undefined) return quotient + percent;
  const literal = DECIMAL.exec(value);
  if (literal && (literal[2] || literal[3])) {
    const [, sign, whole = "", fractional = "", exponent = "0"] = literal;
    const digits = whole + fractional;
    const first = firstNonZero(digits);
    if (first === digits.length) return "0" + percent;
    return canonicalNumber(sign === "-", digits.slice(first, lastNonZero(digits) + 1), BigInt(whole.length - first) + BigInt(exponent)) + percent;
  }
  return value + percent;
}

/** What normalizeAnswer makes of a number (no percentage): `5`, `-0.5`, `1.5e+25`. */
const CANONICAL_NUMBER = /^-?\d+(?:\.\d+)?(?:e[-+]\d+)?$/;
/**
 * What a text wrapper holds: no braces but a power's (`\mathrm{m^{2}}`). A `^` is matched only by
 * the second part, which takes its braces or none, so no two parts match the same characters.
 */
const WRAPPER_HELD_SOURCE = String.raw`((?:[^{}^]|\^(?:\{-?\d+\})?)*)`;
/**
 * A text wrapper closing the answer: `\text{ cm}` (also `\textrm`, `\mathrm`, `\mbox`), what it
 * holds, and the power right after it if any (`\text{ m}^2`, `\mathrm{s}^{-1}`, `\text{ m}²`).
 */
const FINAL_TEXT_WRAPPER = new RegExp(String.raw`\\(?:text|textrm|mathrm|mbox)\{${WRAPPER_HELD_SOURCE}\}(${POWER_AFTER_WRAPPER_SOURCE})?$`);
/**
 * What such a wrapper holds when it is a unit, its powers written with `^` (powersWithCaret): words
 * (`cm`, `km/h`, `m^2`, `m2`, `s^-1`, `°C`, `sq units`), a digit only after a letter, `^`, `^-` or a
 * digit: a number after spacing is another answer (`\text{ or 7}`).
 */
const UNIT = /^[\p{L}°µ](?:[\p{L}°µ\s./^-]|(?<=[\p{L}°µ^\d]|\^-)\d)*$/u;
/**
 * A word joining answers in such a wrapper, `or`, `nor`, `and` or a range's `to` (before spacing, a
 * digit or the end: `5\text{ or seven}`, `5\text{ and seven}`, `5\text{ or7}`): two answers, not a unit.
 */
const HEDGE = /(?:^|\s)(?:or|nor|and|to)(?=\s|\d|$)/i;
/**
 * Euler's number, the imaginary unit and π, set upright (`2\mathrm{e}`, `3\mathrm{i}`, `2\text{π}`):
 * no units, nor with a power (`2\mathrm{e}^2`, `3\mathrm{i}^2`).
 */
const UPRIGHT_CONSTANTS = new Set(["e", "i", "π"]);
/** A power closing a unit once written with `^` (powersWithCaret): `^2`, `^-1`. */
const FINAL_POWER = /\^-?\d+$/;
/**
 * An exponent (`e3`, `E-3`): no unit either. The wrapper is read as what it holds, so `1.5\text{ e3}`
 * normalizes to 1500; taken as 1.5 in a unit `e3` it would equal 1.5 too, right against both. So is an
 * exponent's marker without its digits (`2\text{ E}`, `2\text{ E-}`): a malformed number, as the
 * upright `e` is a constant, never 2 in a unit `E` (no unit's symbol).
 */
const EXPONENT = /^[eE][-+]?\d*$/;
/**
 * LaTeX's degree sign, `^\circ` or `^{\circ}` (spacing allowed; not `^\circle`), gensymb's `\degree`
 * and textcomp's `\textdegree` (not `\degrees`; an empty group may end the macro's name:
 * `\textdegree{}C`), read as `°`.
 */
const DEGREE_SPELLINGS = /\^\s*(?:\\circ(?![A-Za-z])|\{\s*\\circ\s*\})|\\(?:text)?degree(?![A-Za-z])(?:\{\})?/g;
/** Every text wrapper: its macro's name and what it holds. */
const TEXT_WRAPPERS = new RegExp(String.raw`\\(text|textrm|mathrm|mbox)\{${WRAPPER_HELD_SOURCE}\}`, "g");
/**
 * The unit word closing an answer or what a text wrapper holds, `degree`/`degrees`, with its scale
 * if named (`degrees Celsius`, `degrees F`): read as `°`, `°C` or `°F`.
 */
const DEGREE_WORD_SOURCE = String.raw`[Dd]egrees?(?:\s+([Cc]elsius|[Ff]ahrenheit|[CF]))?$`;
const DEGREE_WORD = new RegExp(DEGREE_WORD_SOURCE);
/**
 * The degrees closing the answer, once LaTeX's are read as `°`: a unit too (`90^\circ`, `90°`), and
 * so are degrees Celsius or Fahrenheit, the letter plain or wrapped (`90°C`, `90^\circ\text{C}`):
 * the degree sign marks the letter as a unit, as a wrapper marks a word.
 */
const FINAL_DEGREES = /°\s*(?:[CF]|\\(?:text|textrm|mathrm|mbox)\{\s*[CF]\s*\})?$/;
/** What a text wrapper holds when it ends in degrees (`\text{90°}`, `\text{90 °C}`). */
const HELD_DEGREES = /°\s*[CF]?$/;

/** The degree sign for DEGREE_WORD's scale: `°`, `°C`, `°F`. */
function degreeSign(scale: string | undefined): string {
  return scale ? `°${scale[0]!.toUpperCase()}` : "°";
}

/**
 * `text` with LaTeX's degree signs (DEGREE_SPELLINGS) read as `°`, and so the unit word
 * `degree`/`degrees` (DEGREE_WORD, with its scale) closing a text wrapper, alone in it or after a
 * number (`90\text{ degrees}`, `\text{90 degrees Celsius}`); a word before it stays a word
 * (`5\text{ in degrees}`). Plain text's is plainDegreeWord's.
 */
function degreeSigns(text: string): string {
  return text.replace(DEGREE_SPELLINGS, "°").replace(TEXT_WRAPPERS, (wrapper: string, name: string, held: string) => {
    const trimmed = held.trimEnd();
    const word = DEGREE_WORD.exec(trimmed);
    const before = word ? trimmed.slice(0, word.index).trimEnd() : "";
    // Alone, or after a number's last digit (`\text{90degrees}` too); `\text{ in degrees}` stays words.
    if (!word || (before !== "" && !/\d$/.test(before))) return wrapper;
    return `\\${name}{${before}${degreeSign(word[1])}}`;
  });
}

/**
 * A plain-text `degree`/`degrees` (with its scale) closing `answer` (spacing, `$` and a final period
 * removed) right after a number's digit, read as `°`: `90 degrees` is `90°`, `90 degrees Celsius`
 * `90°C`. Unlike other plain-text words (`5 cm`, `5 x`, `2 pi`) it is no variable or constant, so a
 * wrapper is not needed to mark it as a unit; after anything but a digit it stays text (`x degrees`).
 * The `$` or braces closing the number may come between (`$90$ degrees`, `\text{90} degrees`,
 * `\frac{1}{2} degrees`): the `$` is dropped, so `$90$ degrees` is `90°` as `$90^\circ$` is.
 */
function plainDegreeWord(answer: string): string {
  const word = DEGREE_WORD.exec(answer);
  if (!word) return answer;
  const closed = closersStart(answer, word.index);
  if (!/\d/.test(answer[closed - 1] ?? "")) return answer;
  // Braces kept (`\frac{1}{2}°`); spacing and `$` dropped, so `$90$ degrees` reads as `$90°$` does.
  return answer.slice(0, closed) + answer.slice(closed, word.index).replace(/[^}]/g, "") + degreeSign(word[1]);
}

/**
 * Where the run of spacing (also LaTeX's `\,` `\:` `\;` `\!` `\ `), `$` (also `\$`) and `}` ending
 * at `end` starts: what may close a number before a plain-text unit word. One pass back, whatever the
 * run's length. normalizeAnswer sees these LaTeX spellings already read (latexPlain), numberBeforeUnit
 * as written: both must find the same number.
 */
function closersStart(text: string, end: number): number {
  let at = end;
  for (;;) {
    if (at > 0 && /[\s$}]/.test(text[at - 1]!)) at -= 1;
    else if (at > 1 && text[at - 2] === "\\" && /[,:;!]/.test(text[at - 1]!)) at -= 2;
    // A backslash escaping the space or `$` just passed: `\ `, `\$`.
    else if (at > 0 && text[at - 1] === "\\" && /[\s$]/.test(text[at] ?? "")) at -= 1;
    else return at;
  }
}

/**
 * An answer that is a number followed by a unit in a text wrapper (`5\text{ cm}`,
 * `\boxed{\frac12\,\mathrm{m}}`, or the number in it too, spacing before the unit: `\text{5 cm}`)
 * or by degrees (`90^\circ`, `90\degree`, `90°`, `\text{90°}`, `\text{90 degrees}`, a plain-text
 * `90 degrees`, `90^\circ\text{C}`, `90°F`, `90 degrees Celsius`): its normalized number. A unit is
 * marked as text (or by the degree sign, or is the word degrees), so another plain-text suffix is
 * none (`5 x`, `2 pi` may be a variable or a constant), nor is one with anything after it but its
 * power (`5\text{ cm}^2` is a unit `cm^2`; `5\text{ or }7`, `90^\circ 5` are none), nor an exponent
 * or its marker (`1.5\text{ e3}` is 1500, `2\text{ E}` no 2).
 */
export function numberBeforeUnit(text: string): string | undefined {
  return numberAndUnit(text)?.number;
}

/**
 * An answer that is a number followed by a unit (numberBeforeUnit's rules): the number normalized
 * as a bare one is, and the unit as one spelling (canonicalUnit), so two such answers compare number
 * to number and unit to unit.
 */
function numberAndUnit(text: string): NumberAndUnit | undefined {
  const split = splitUnit(text);
  if (split === undefined) return undefined;
  const number = normalizeAnswer(split.before);
  if (!CANONICAL_NUMBER.test(number)) return undefined;
  const plain = latexPlain(split.unit).trim();
  return { number, unit: canonicalUnit(plain), plain, written: plain.replace(/\s+/g, "") };
}

/**
 * numberAndUnit's answer: the number, the unit as compared (canonicalUnit), as plain text with its
 * spacing (its words), and as normalizeAnswer's text holds it (no spacing).
 */
interface NumberAndUnit {
  number: string;
  unit: string;
  plain: string;
  written: string;
}

/** The unit closing `text` (by numberBeforeUnit's rules) and what comes before it, number or not; undefined without one. */
function splitUnit(text: string): { before: string; unit: string } | undefined {
  const answer = degreesOutOfFinalWrapper(plainDegreeWord(stripDecoration(degreeSigns(extractAnswer(text)))));
  const degrees = FINAL_DEGREES.exec(answer);
  if (degrees) return { before: answer.slice(0, degrees.index), unit: answer.slice(degrees.index) };
  const wrapper = FINAL_TEXT_WRAPPER.exec(answer);
  if (!wrapper) return undefined;
  const number = numberOpeningWrapper(wrapper[1]!);
  // Spacing after the caret is LaTeX's (`\text{ m}^ 2` is m²): the power is read without it.
  const unit = wrapper[1]!.slice(number.length).trim() + (wrapper[2] ?? "").replace(/\s+/g, "");
  const withCaret = powersWithCaret(unit);
  // A constant or an exponent's marker raised to a power is still no unit: `2\mathrm{e}^2` is 2e², not 2.
  const base = withCaret.replace(FINAL_POWER, "");
  if (!unit || !UNIT.test(withCaret) || HEDGE.test(unit) || UPRIGHT_CONSTANTS.has(base) || EXPONENT.test(base)) return undefined;
  return { before: answer.slice(0, wrapper.index) + number, unit };
}

/**
 * What a text wrapper holds before its unit when spacing (also LaTeX's `\,` `\:` `\;`) separates
 * them (`5 ` of `\text{5 cm}`), else "": it is then the number before a wrapped unit, and whether it
 * is a number is decided as for one (`\text{x 5 cm}` is none). Glued to a letter it is not split
 * off: `\text{2e5}` is a number, not 2 in a unit `e5`.
 */
function numberOpeningWrapper(held: string): string {
  const unitAt = held.search(/[\p{L}°µ]/u);
  if (unitAt <= 0) return "";
  const before = held.slice(0, unitAt);
  return /\s$|\\[,:;]$/.test(before.slice(-2)) ? before : "";
}

/**
 * A final text wrapper ending in degrees (`\text{90°}`, `\text{90°C}`) unwrapped, so they close the
 * answer (`90°`, `90°C`); not one with a power after it (`\text{90°}^2` is no degrees).
 */
function degreesOutOfFinalWrapper(answer: string): string {
  const wrapper = FINAL_TEXT_WRAPPER.exec(answer);
  const held = wrapper?.[1]!.trimEnd();
  return wrapper && wrapper[2] === undefined && HELD_DEGREES.test(held!) ? answer.slice(0, wrapper.index) + held : answer;
}

/**
 * Whether two answers are the same: the same number where both carry a unit (numberAndUnit) and
 * it is one unit, else equal once normalized, or the same number where one side carries a unit and
 * the other is the bare number. The question names the unit, so a data set's `5` and a model's
 * `5\text{ cm}` (or the reverse) are one answer; two units must be one unit (canonicalUnit:
 * `5\text{ cm}` is not `5\text{ m}`, no conversion; `5\text{ Mm}` is not `5\text{ mm}`, a prefix's
 * case is its meaning; `m2` is `m^2`), their numbers compared as bare numbers are (`5\text{ cm}`
 * is `5.0\text{ cm}`, `45^\circ` is `\frac{90}{2}^\circ`).
 */
export function sameAnswer(expected: string, answer: string): boolean {
  const withUnit = [numberAndUnit(expected), numberAndUnit(answer)] as const;
  // Never as text, which ignores case: the units decide.
  if (withUnit[0] && withUnit[1]) return withUnit[0].number === withUnit[1].number && withUnit[0].unit === withUnit[1].unit;
  const cased = [normalizedKeepingCase(expected), normalizedKeepingCase(answer)] as const;
  const normalized = [cased[0].toLowerCase(), cased[1].toLowerCase()] as const;
  if (normalized[0] === normalized[1]) {
    if (withUnit[0]) return sameUnitLetters(cased[0], withUnit[0], cased[1]);
    if (withUnit[1]) return sameUnitLetters(cased[1], withUnit[1], cased[0]);
    return true;
  }
  if (withUnit[0]) return withUnit[0].number === normalized[1];
  if (withUnit[1]) return withUnit[1].number === normalized[0];
  return false;
}

/**
 * Whether `other`, a text equal but for case to `withUnit` (an answer ending in `unit`, both as
 * normalizedKeepingCase writes them), ends in that unit's letters as a unit's letters compare, word
 * by word as the unit is written (caseOfUnitWords): plain-text `5 mm` is `5\text{ mm}` but not
 * `5\text{ Mm}`, `5 square units` is `5\text{ Square Units}`, while the number's own letters keep
 * ignoring case (`2.5E3\text{ m}` is `2.5e3 m`).
 */
function sameUnitLetters(withUnit: string, unit: NumberAndUnit, other: string): boolean {
  const { written, plain } = unit;
  if (!withUnit.endsWith(written)) return withUnit === other;
  return caseOfUnitWords(plain, other.slice(other.length - written.length)) === caseOfUnitWords(plain, written);
}

/** `a/b` or a LaTeX fraction (signedLatexFraction) as [a, b]. */
function fractionTerms(value: string): [string, string] | undefined {
  const plain = /^(-?\d+)\/(\d+)$/.exec(value);
  return plain ? [plain[1]!, plain[2]!] : signedLatexFraction(value);
}

/**
 * Why `expected` cannot be a task's expected answer, or undefined. Nothing once normalized: a data
 * set's missing answer sent as "" would reward every empty answer and no real one. A fraction over
 * zero (`1/0`, `\frac{1}{0}`, `0/0`), also before a unit (`1/0\text{ m}`, `1/0^\circ`): no number,
 * so it was compared as text, and only the same division written out scored.
 */
export function expectedAnswerProblem(expected: string): string | undefined {
  const normalized = normalizeAnswer(expected);
  if (normalized === "") return "is empty once normalized (only spacing, `$`, periods or an empty \\boxed{})";
  const beforeUnit = splitUnit(expected)?.before;
  if (dividesByZero(normalized) || (beforeUnit !== undefined && dividesByZero(normalizeAnswer(beforeUnit)))) {
    return "divides by zero: it is no number, and no answer could equal it but the same division written out";
  }
  return undefined;
}

/** Whether a normalized answer is a fraction (a percentage's too) over zero. */
function dividesByZero(normalized: string): boolean {
  const fraction = fractionTerms(normalized.endsWith("%") ? normalized.slice(0, -1) : normalized);
  return fraction !== undefined && /^0+$/.test(fraction[1]);
}

/** Refuses a task whose expected answer cannot be one (expectedAnswerProblem), quoting it (its start, if long). */
function checkExpectedAnswer(expected: string): void {
  const problem = expectedAnswerProblem(expected);
  if (problem === undefined) return;
  const quoted = expected.length > 100 ? `${JSON.stringify(expected.slice(0, 100)).slice(0, -1)}…"` : JSON.stringify(expected);
  throw new CheckpointError("invalid_request", `task.expected_answer ${quoted} ${problem}`);
}

/**
 * `\frac{a}{b}` (or its display and text forms `\dfrac`, `\tfrac`) as [a, b]; a sign before it
 * (`-\frac{1}{2}`, as models write it) is a's, as in `-1/2`. An argument without braces is one
 * digit, as in LaTeX: `\frac12` is 1/2, `\frac123` no fraction (½ followed by 3).
 */
function signedLatexFraction(value: string): [string, string] | undefined {
  const match = /^(-?)\\[dt]?frac(?:\{(-?\d+)\}|(\d))(?:\{(\d+)\}|(\d))$/.exec(value);
  if (!match) return undefined;
  const numerator = match[2] ?? match[3]!;
  if (match[1] && numerator.startsWith("-")) return undefined;
  return [match[1]! + numerator, match[4] ?? match[5]!];
}

/**
 * LaTeX's (and Unicode's) other spellings of what the rules below read: `\$` is a dollar sign,
 * `\%` a percent sign, `{,}` a comma (the thousands separator of `1{,}000`), the spacing commands
 * `\,` `\:` `\;` and `\ ` are spacing (`1\,000`), removed like spaces, the negative thin space
 * `\!` is none (`10,\!000`), `\text{…}` (`\textrm`, `\mathrm`, `\mbox`) is what it holds (a unit
 * stays: `5\text{ cm}` is `5 cm`; only sameAnswer sets it aside, against a bare number), `^\circ`,
 * `^{\circ}`, `\degree`, `\textdegree` and a wrapped `degrees` (degreeSigns) are the degree sign `°`
 * (so `90^\circ` and `\text{90 degrees}` are `90°`; read before and after unwrapping, for
 * `\text{90\degree}`), and the minus sign U+2212 is `-`.
 */
function latexPlain(text: string): string {
  return degreeSigns(text)
    .replace(TEXT_WRAPPERS, "$2")
    .replace(DEGREE_SPELLINGS, "°")
    .replace(/\\([$%])/g, "$1")
    .replace(/\{,\}/g, ",")
    .replace(/\\!/g, "")
    .replace(/\\[,:; ]/g, " ")
    .replace(/\u2212/g, "-");
}

/** Whitespace, `$` on either side and a trailing period, removed until none is left (`$42$.` → `42`). */
function stripDecoration(text: string): string {
  let start = 0;
  let end = text.length;
  for (let changed = true; changed; ) {
    changed = false;
    while (start < end && (/\s/.test(text[start]!) || text[start] === "$")) (start += 1), (changed = true);
    while (end > start && (/\s/.test(text[end - 1]!) || text[end - 1] === "$" || text[end - 1] === ".")) (end -= 1), (changed = true);
  }
  return text.slice(start, end);
}

function firstNonZero(digits: string): number {
  let i = 0;
  while (i < digits.length && digits[i] === "0") i += 1;
  return i;
}

function lastNonZero(digits: string): number {
  let i = digits.length - 1;
  while (i >= 0 && digits[i] === "0") i -= 1;
  return i;
}

/** `numerator / denominator` canonical (exact decimal arithmetic); undefined for a zero denominator or terms too long. */
function canonicalQuotient(numerator: string, denominator: string): string | undefined {
  if (numerator.length > MAX_FRACTION_DIGITS || denominator.length > MAX_FRACTION_DIGITS) return undefined;
  const d = BigInt(denominator);
  if (d === 0n) return undefined;
  const n = BigInt(numerator);
  const negative = n < 0n;
  const magnitude = negative ? -n : n;
  if (magnitude === 0n) return "0";
  // Enough digits of the quotient for the rounding digit: at least 14 whatever the terms' lengths,
  // and at least two decimals (a non-integer is never rounded coarser than its first).
  const shift = Math.max(2, 14 + String(d).length - String(magnitude).length);
  const scaled = String((magnitude * 10n ** BigInt(shift)) / d);
  const exact = (magnitude * 10n ** BigInt(shift)) % d === 0n;
  const integerDigits = BigInt(scaled.length - shift);
  // An inexact quotient keeps one more non-zero digit, so it never reads as an integer.
  const digits = exact ? scaled.slice(0, lastNonZero(scaled) + 1) : `${scaled}1`;
  return canonicalNumber(negative, digits, integerDigits);
}

/**
 * The canonical text of ±0.`digits` × 10^`integerDigits` (`digits`: no leading or trailing zeros),
 * written as JavaScript writes numbers (`0.5`, `1e-7`, `1.5e+25`):
 *   - an integer of at most 1000 digits in full, digit for digit;
 *   - a longer integer rounded half up to 12 significant digits;
 *   - any other number rounded half up to 12 significant digits, but never coarser than its first
 *     decimal: 12 significant digits absorb floating-point noise (`2.9999999999999` is 3,
 *     `0.30000000000000004` is 0.3), and no integer digit is ever rounded away. At 12 digits alone
 *     20! + 0.5 read as 2432902008180000000 and equalled that integer (3,359,999.5 away), or any
 *     number that far off, while 20! itself, 0.5 away, did not. A number that rounds to an
 *     integer is written as that integer is (so it equals it: within 0.05 at most from 10^11 up).
 */
function canonicalNumber(negative: boolean, digits: string, integerDigits: bigint): string {
  const sign = negative ? "-" : "";
  const integer = integerDigits >= BigInt(digits.length);
  if (integer && integerDigits <= BigInt(MAX_EXACT_DIGITS)) return sign + digits + "0".repeat(Number(integerDigits) - digits.length);
  // A non-integer has fewer integer digits than digits (at most 100,000): Number() is exact.
  const keep = integer ? SIGNIFICANT_DIGITS : Math.max(SIGNIFICANT_DIGITS, Number(integerDigits) + 1);
  let kept = digits.slice(0, keep);
  let point = integerDigits;
  if (digits.length > keep && digits[keep]! >= "5") {
    // Half up, in the digit string (a BigInt of 100,000 digits would be slow to write back).
    const last = lastNotNine(kept);
    if (last === -1) (kept = "1"), (point += 1n); // 999… rounded up to 1000…
    else kept = kept.slice(0, last) + String(Number(kept[last]) + 1);
  }
  kept = kept.slice(0, lastNonZero(kept) + 1);
  // Rounded to an integer: written as that integer is, so the two are equal.
  if (!integer && point >= BigInt(kept.length)) return canonicalNumber(negative, kept, point);
  const exponent = point - 1n;
  if (exponent >= -6n && exponent < 21n) {
    const at = Number(point);
    if (at <= 0) return `${sign}0.${"0".repeat(-at)}${kept}`;
    if (at < kept.length) return `${sign}${kept.slice(0, at)}.${kept.slice(at)}`;
    return sign + kept + "0".repeat(at - kept.length);
  }
  return `${sign}${kept[0]}${kept.length > 1 ? `.${kept.slice(1)}` : ""}e${exponent > 0n ? "+" : "-"}${exponent < 0n ? -exponent : exponent}`;
}

function lastNotNine(digits: string): number {
  let i = digits.length - 1;
  while (i >= 0 && digits[i] === "9") i -= 1;
  return i;
}

/** Exact-answer math: reward 1 when the answer is the expected one (sameAnswer). */
export class MathVerifier extends VerifierServer {
  override checkSeededTask(task: JsonValue): void {
    checkExpectedAnswer(parseVerifierBody(MathSeedTaskSchema, { task }).task.expected_answer);
  }

  async verify(body: unknown): Promise<VerifyResult> {
    const { task, answer } = parseVerifierBody(MathVerifyBodySchema, body);
    checkExpectedAnswer(task.expected_answer);
    const extracted = normalizeAnswer(answer);
    return { reward: sameAnswer(task.expected_answer, answer) ? 1 : 0, extracted };
  }
}
