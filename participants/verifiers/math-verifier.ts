import { z } from "zod";
import { VerifierServer, parseVerifierBody, type VerifyResult } from "./verifier-server.js";

const MathVerifyBodySchema = z
  .object({ task: z.object({ expected_answer: z.string().max(10_000) }).catchall(z.json()), answer: z.string().max(100_000) })
  .strict();

/** The final answer of a response: the last \boxed{...} if any, else the whole text. */
export function extractAnswer(text: string): string {
  const marker = "\\boxed{";
  const at = text.lastIndexOf(marker);
  if (at === -1) return text;
  let depth = 1;
  for (let i = at + marker.length; i < text.length; i += 1) {
    if (text[i] === "{") depth += 1;
    else if (text[i] === "}" && --depth === 0) return text.slice(at + marker.length, i);
  }
  return text;
}

/** Longest integer compared digit for digit; a longer one falls back to the 12-significant-digit rule. */
const MAX_EXACT_DIGITS = 1000;

/**
 * Normalizes an answer: spacing, `$`, a trailing period, thousands separators, numbers and
 * fractions. Integers (also `2.5e3`, `4/2`) are compared exactly, digit for digit — as doubles,
 * 20! + 1 would equal 20! — and other numbers to 12 significant digits.
 */
export function normalizeAnswer(text: string): string {
  let value = extractAnswer(text).trim().replace(/^\$+|\$+$/g, "").replace(/\.$/, "").replace(/\s+/g, "");
  if (/^-?\d{1,3}(,\d{3})+(\.\d+)?$/.test(value)) value = value.replace(/,/g, "");
  const fraction = /^(-?\d+)\/(\d+)$/.exec(value) ?? /^\\frac\{(-?\d+)\}\{(\d+)\}$/.exec(value);
  if (fraction && Number(fraction[2]) !== 0) return exactQuotient(fraction[1]!, fraction[2]!) ?? approximateNumber(Number(fraction[1]) / Number(fraction[2]));
  if (/^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$/i.test(value)) return exactInteger(value) ?? approximateNumber(Number(value));
  return value.toLowerCase();
}

/** The canonical digits of a decimal literal whose value is an integer (`-0012.50e1` → `-125`), else undefined. */
function exactInteger(literal: string): string | undefined {
  const parts = /^([-+]?)(\d*)(?:\.(\d*))?(?:e([-+]?\d+))?$/i.exec(literal);
  if (!parts) return undefined;
  const [, sign, whole = "", fractional = "", exponent = "0"] = parts;
  let digits = whole + fractional;
  // Integer digits of the value: where the decimal point sits in `digits`.
  let point = whole.length + Number(exponent);
  const leading = /^0*/.exec(digits)![0].length;
  if (leading === digits.length) return "0";
  digits = digits.slice(leading).replace(/0+$/, "");
  point -= leading;
  if (point < digits.length || point > MAX_EXACT_DIGITS) return undefined;
  return (sign === "-" ? "-" : "") + digits + "0".repeat(point - digits.length);
}

/** `numerator / denominator` as canonical digits when it is an integer, else undefined. */
function exactQuotient(numerator: string, denominator: string): string | undefined {
  if (numerator.length > MAX_EXACT_DIGITS || denominator.length > MAX_EXACT_DIGITS) return undefined;
  const n = BigInt(numerator);
  const d = BigInt(denominator);
  return n % d === 0n ? String(n / d) : undefined;
}

/** Non-integers (and integers too long to compare exactly): 12 significant digits. */
function approximateNumber(n: number): string {
  return String(Number(n.toPrecision(12)));
}

/** Exact-answer math: reward 1 when the normalized answer equals the normalized expected answer. */
export class MathVerifier extends VerifierServer {
  async verify(body: unknown): Promise<VerifyResult> {
    const { task, answer } = parseVerifierBody(MathVerifyBodySchema, body);
    const extracted = normalizeAnswer(answer);
    return { reward: extracted === normalizeAnswer(task.expected_answer) ? 1 : 0, extracted };
  }
}
