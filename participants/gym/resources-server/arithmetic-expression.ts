import { CheckpointError } from "../../../protocol/index.js";

/**
 * A small arithmetic evaluator for the calculator tool (never `eval`): numbers, + - * /,
 * parentheses and unary minus/plus. Recursive descent with bounded length and depth.
 * `calculate` computes exactly (BigInt fractions) so integer results print digit for digit
 * (doubles would round 2^53 + 1 and print 10^21 as 1e+21), powers of ten apart (1e-5000 * 0 is 0);
 * it falls back to doubles only when an exact value would grow past MAX_EXACT_BITS (a sum of
 * terms thousands of powers of ten apart, like 1 + 1e-5000, or products of many long numbers).
 */
export const MAX_EXPRESSION_LENGTH = 1000;
const MAX_DEPTH = 64;
/** Largest numerator or denominator (bits) kept exact: ~1200 digits, more than a 1000-character expression writes. */
const MAX_EXACT_BITS = 4000;

type Token = { type: "num"; value: number; text: string } | { type: "op"; value: "+" | "-" | "*" | "/" | "(" | ")" };

function tokenize(text: string): Token[] {
  const tokens: Token[] = [];
  let i = 0;
  while (i < text.length) {
    const ch = text[i]!;
    if (ch === " " || ch === "\t") {
      i += 1;
    } else if ("+-*/()".includes(ch)) {
      tokens.push({ type: "op", value: ch as "+" });
      i += 1;
    } else if (/[0-9.]/.test(ch)) {
      const match = /^\d*\.?\d+(?:[eE][+-]?\d+)?|^\d+\.?/.exec(text.slice(i));
      if (!match) throw invalid(`bad number at ${i}`);
      tokens.push({ type: "num", value: Number(match[0]), text: match[0] });
      i += match[0].length;
    } else {
      throw invalid(`unexpected character ${JSON.stringify(ch)} at ${i}`);
    }
  }
  return tokens;
}

function invalid(detail: string): CheckpointError {
  return new CheckpointError("invalid_request", `invalid expression: ${detail}`);
}

/** The arithmetic an evaluation runs on: doubles, or exact fractions. */
interface Arithmetic<T> {
  literal(token: { value: number; text: string }): T;
  add(a: T, b: T): T;
  subtract(a: T, b: T): T;
  multiply(a: T, b: T): T;
  /** `b` is not zero. */
  divide(a: T, b: T): T;
  negate(a: T): T;
  isZero(a: T): boolean;
}

const DOUBLES: Arithmetic<number> = {
  literal: (token) => token.value,
  add: (a, b) => a + b,
  subtract: (a, b) => a - b,
  multiply: (a, b) => a * b,
  divide: (a, b) => a / b,
  negate: (a) => -a,
  isZero: (a) => a === 0,
};

/**
 * n / d × 10^e, n / d in lowest terms, d > 0 (zero is 0 / 1 × 10^0). The power of ten is kept
 * apart so a literal such as 1e-5000 stays exact without building 10^5000: products, quotients and
 * differences of such literals (1e-5000 * 0, 1e5000 - 1e5000) are computed, not given up on.
 */
interface Fraction {
  n: bigint;
  d: bigint;
  e: bigint;
}

/** Thrown when an exact value grows past MAX_EXACT_BITS: the evaluation is redone in doubles. */
class TooLarge extends Error {}

function gcd(a: bigint, b: bigint): bigint {
  a = a < 0n ? -a : a;
  while (b !== 0n) [a, b] = [b, a % b];
  return a;
}

function bits(value: bigint): number {
  return (value < 0n ? -value : value).toString(2).length;
}

const ZERO: Fraction = { n: 0n, d: 1n, e: 0n };

function fraction(n: bigint, d: bigint, e: bigint): Fraction {
  if (n === 0n) return ZERO;
  if (d < 0n) [n, d] = [-n, -d];
  const g = gcd(n, d);
  const reduced = g > 1n ? { n: n / g, d: d / g, e } : { n, d, e };
  if (bits(reduced.n) > MAX_EXACT_BITS || bits(reduced.d) > MAX_EXACT_BITS) throw new TooLarge();
  return reduced;
}

/** a + b with both scaled to the smaller power of ten; a gap that would grow past MAX_EXACT_BITS is TooLarge. */
function sum(a: Fraction, b: Fraction): Fraction {
  if (a.n === 0n) return b;
  if (b.n === 0n) return a;
  const [low, high] = a.e <= b.e ? [a, b] : [b, a];
  const gap = high.e - low.e;
  // Checked before 10n ** gap is built: 1 + 1e-999999 would take megabytes.
  if (gap > BigInt(MAX_EXACT_BITS)) throw new TooLarge();
  const highN = high.n * 10n ** gap;
  return fraction(low.n * high.d + highN * low.d, low.d * high.d, low.e);
}

const FRACTIONS: Arithmetic<Fraction> = {
  literal: (token) => {
    const [, whole = "", decimals = "", exponent = "0"] = /^(\d*)\.?(\d*)(?:[eE]([+-]?\d+))?$/.exec(token.text)!;
    return fraction(BigInt(whole + decimals || "0"), 1n, BigInt(exponent) - BigInt(decimals.length));
  },
  add: sum,
  subtract: (a, b) => sum(a, FRACTIONS.negate(b)),
  multiply: (a, b) => fraction(a.n * b.n, a.d * b.d, a.e + b.e),
  divide: (a, b) => fraction(a.n * b.d, a.d * b.n, a.e - b.e),
  negate: (a) => ({ n: -a.n, d: a.d, e: a.e }),
  isZero: (a) => a.n === 0n,
};

/**
 * Past this power of ten an exact result is out of every double's range whatever n / d is (both
 * hold at most MAX_EXACT_BITS, ~1205 digits, and doubles end near 1e308 and 5e-324).
 */
const MAX_RESULT_EXPONENT = 2000n;

export function evaluateExpression(text: string): number {
  return evaluate(text, DOUBLES);
}

function evaluate<T>(text: string, arithmetic: Arithmetic<T>): T {
  if (text.length > MAX_EXPRESSION_LENGTH) throw invalid(`longer than ${MAX_EXPRESSION_LENGTH} characters`);
  const tokens = tokenize(text);
  let pos = 0;
  const peek = () => tokens[pos];
  const isOp = (value: string) => {
    const token = peek();
    return token?.type === "op" && token.value === value;
  };

  const expression = (depth: number): T => {
    let value = term(depth);
    while (isOp("+") || isOp("-")) {
      const op = (tokens[pos++] as { value: string }).value;
      const right = term(depth);
      value = op === "+" ? arithmetic.add(value, right) : arithmetic.subtract(value, right);
    }
    return value;
  };
  const term = (depth: number): T => {
    let value = factor(depth);
    while (isOp("*") || isOp("/")) {
      const op = (tokens[pos++] as { value: string }).value;
      const right = factor(depth);
      if (op === "/" && arithmetic.isZero(right)) throw invalid("division by zero");
      value = op === "*" ? arithmetic.multiply(value, right) : arithmetic.divide(value, right);
    }
    return value;
  };
  const factor = (depth: number): T => {
    if (depth > MAX_DEPTH) throw invalid("nested too deeply");
    const token = peek();
    if (!token) throw invalid("unexpected end");
    if (token.type === "num") {
      pos += 1;
      return arithmetic.literal(token);
    }
    if (token.value === "-" || token.value === "+") {
      pos += 1;
      const inner = factor(depth + 1);
      return token.value === "-" ? arithmetic.negate(inner) : inner;
    }
    if (token.value === "(") {
      pos += 1;
      const inner = expression(depth + 1);
      if (!isOp(")")) throw invalid("missing )");
      pos += 1;
      return inner;
    }
    throw invalid(`unexpected ${token.value}`);
  };

  const value = expression(0);
  if (pos !== tokens.length) throw invalid("trailing input");
  if (typeof value === "number" && !Number.isFinite(value)) throw invalid("result is not finite");
  return value;
}

/** Integers print exactly; other results with at most 12 significant digits. */
export function formatResult(value: number): string {
  if (Number.isInteger(value)) return String(value);
  return String(Number(value.toPrecision(12)));
}

/** The result as printed: an integer digit for digit, other numbers with 12 significant digits. */
export function calculate(text: string): string {
  let exact: Fraction;
  try {
    exact = evaluate(text, FRACTIONS);
  } catch (error) {
    if (!(error instanceof TooLarge)) throw error;
    // Past exact arithmetic's size, doubles: a 0 there may be an underflow (1e-5000 + 1 - 1) as
    // well as a true zero, and printing it would verify the answer "0"; refused like the exact path's.
    const value = evaluateExpression(text);
    if (value === 0) throw invalid("result is too small for a double");
    return formatResult(value);
  }
  if (exact.e > MAX_RESULT_EXPONENT) throw invalid("result is not finite");
  if (exact.e < -MAX_RESULT_EXPONENT) throw invalid("result is too small for a double");
  return formatExact(exact.e >= 0n ? { n: exact.n * 10n ** exact.e, d: exact.d } : { n: exact.n, d: exact.d * 10n ** -exact.e });
}

/** An exact n / d printed (a result a double cannot hold is refused here too). */
function formatExact(exact: { n: bigint; d: bigint }): string {
  if (exact.n === 0n) return "0";
  if (exact.d === 1n) {
    if (!Number.isFinite(Number(exact.n))) throw invalid("result is not finite");
    return String(exact.n);
  }
  const value = fractionToDouble(exact);
  if (!Number.isFinite(value)) throw invalid("result is not finite");
  // A non-zero result below the smallest double would print as 0 (and verify a "0" answer).
  if (value === 0) throw invalid("result is too small for a double");
  return String(Number(value.toPrecision(12)));
}

/**
 * n/d as the nearest double (to within an ulp): the integer quotient taken with 64 significant
 * bits, then scaled by the power of two that was shifted in. Converting n and d separately fails
 * when either has more than 1023 bits, and scaling both alike can leave the smaller one no bits.
 */
function fractionToDouble({ n, d }: { n: bigint; d: bigint }): number {
  const shift = 64 - (bits(n) - bits(d));
  const quotient = shift >= 0 ? (n << BigInt(shift)) / d : n / (d << BigInt(-shift));
  // In steps, so an intermediate power of two neither overflows nor underflows on its own.
  let value = Number(quotient);
  for (let rest = -shift; rest !== 0; ) {
    const step = Math.max(-1000, Math.min(1000, rest));
    value *= 2 ** step;
    rest -= step;
  }
  return value;
}
