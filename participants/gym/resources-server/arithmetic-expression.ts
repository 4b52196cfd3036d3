import { CheckpointError } from "../../../protocol/index.js";

/**
 * A small arithmetic evaluator for the calculator tool (never `eval`): numbers, + - * /,
 * parentheses and unary minus/plus. Recursive descent with bounded length and depth.
 */
export const MAX_EXPRESSION_LENGTH = 1000;
const MAX_DEPTH = 64;

type Token = { type: "num"; value: number } | { type: "op"; value: "+" | "-" | "*" | "/" | "(" | ")" };

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
      tokens.push({ type: "num", value: Number(match[0]) });
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

export function evaluateExpression(text: string): number {
  if (text.length > MAX_EXPRESSION_LENGTH) throw invalid(`longer than ${MAX_EXPRESSION_LENGTH} characters`);
  const tokens = tokenize(text);
  let pos = 0;
  const peek = () => tokens[pos];
  const isOp = (value: string) => {
    const token = peek();
    return token?.type === "op" && token.value === value;
  };

  const expression = (depth: number): number => {
    let value = term(depth);
    while (isOp("+") || isOp("-")) {
      const op = (tokens[pos++] as { value: string }).value;
      const right = term(depth);
      value = op === "+" ? value + right : value - right;
    }
    return value;
  };
  const term = (depth: number): number => {
    let value = factor(depth);
    while (isOp("*") || isOp("/")) {
      const op = (tokens[pos++] as { value: string }).value;
      const right = factor(depth);
      if (op === "/" && right === 0) throw invalid("division by zero");
      value = op === "*" ? value * right : value / right;
    }
    return value;
  };
  const factor = (depth: number): number => {
    if (depth > MAX_DEPTH) throw invalid("nested too deeply");
    const token = peek();
    if (!token) throw invalid("unexpected end");
    if (token.type === "num") {
      pos += 1;
      return token.value;
    }
    if (token.value === "-" || token.value === "+") {
      pos += 1;
      const inner = factor(depth + 1);
      return token.value === "-" ? -inner : inner;
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
  if (!Number.isFinite(value)) throw invalid("result is not finite");
  return value;
}

/** Integers print exactly; other results with at most 12 significant digits. */
export function formatResult(value: number): string {
  if (Number.isInteger(value)) return String(value);
  return String(Number(value.toPrecision(12)));
}

export function calculate(text: string): string {
  return formatResult(evaluateExpression(text));
}
