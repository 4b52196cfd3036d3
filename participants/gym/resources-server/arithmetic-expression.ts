import { CheckpointError } from "../../../protocol/index.js";

/**
 * A small arithmetic evaluator for the calculator tool (never `eval`): numbers, + - * /,
 * parentheses and unary minus/plus. Recursive descent with bounded length and depth.
 * `calculate` computes exactly (BigInt fractions) so integer results print digit for digit
 * (doubles would round 2^53 + 1 and print 10^21 as 1e+21); it falls back to doubles only when
 * an exact value would grow past MAX_EXACT_BITS (a literal like 1e999999, or products of many).
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

/** n / d in lowest terms, d > 0. */
interface Fraction {
  n: bigint;
  d: bigint;
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

function fraction(n: bigint, d: bigint): Fraction {
  if (d < 0n) [n, d] = [-n, -d];
  const g = gcd(n, d);
  const reduced = g > 1n ? { n: n / g, d: d / g } : { n, d };
  if (bits(reduced.n) > MAX_EXACT_BITS || bits(reduced.d) > MAX_EXACT_BITS) throw new TooLarge();
  return reduced;
}

const FRACTIONS: Arithmetic<Fraction> = {
  literal: (token) => {
    const [, whole = "", decimals = "", exponent = "0"] = /^(\d*)\.?(\d*)(?:[eE]([+-]?\d+))?$/.exec(token.text)!;
    const power = Number(exponent) - decimals.length;
    const digits = BigInt(whole + decimals || "0");
    // Zero whatever its exponent: 0e5000 is no value doubles lose (they would refuse it as too small).
    if (digits === 0n) return { n: 0n, d: 1n };
    // Checked before 10n ** power is built: 1e999999 would take megabytes.
    if (Math.abs(power) > MAX_EXACT_BITS) throw new TooLarge();
    return power >= 0 ? fraction(digits * 10n ** BigInt(power), 1n) : fraction(digits, 10n ** BigInt(-power));
  },
  add: (a, b) => fraction(a.n * b.d + b.n * a.d, a.d * b.d),
  subtract: (a, b) => fraction(a.n * b.d - b.n * a.d, a.d * b.d),
  multiply: (a, b) => fraction(a.n * b.n, a.d * b.d),
  divide: (a, b) => fraction(a.n * b.d, a.d * b.n),
  negate: (a) => ({ n: -a.n, d: a.d }),
  isZero: (a) => a.n === 0n,
};

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
    // Past exact arithmetic's size, doubles: a 0 there may be an underflow (1e-5000) as well as a
    // true zero, and printing it would verify the answer "0"; refused like the exact path's.
    const value = evaluateExpression(text);
    if (value === 0) throw invalid("result is too small for a double");
    return formatResult(value);
  }
  // Results a double cannot hold stay refused, as before.
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
function fractionToDouble({ n, d }: Fraction): number {
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
