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

/** Normalizes an answer: spacing, `$`, a trailing period, thousands separators, numbers and fractions. */
export function normalizeAnswer(text: string): string {
  let value = extractAnswer(text).trim().replace(/^\$+|\$+$/g, "").replace(/\.$/, "").replace(/\s+/g, "");
  if (/^-?\d{1,3}(,\d{3})+(\.\d+)?$/.test(value)) value = value.replace(/,/g, "");
  const fraction = /^(-?\d+)\/(\d+)$/.exec(value) ?? /^\\frac\{(-?\d+)\}\{(\d+)\}$/.exec(value);
  if (fraction && Number(fraction[2]) !== 0) return canonicalNumber(Number(fraction[1]) / Number(fraction[2]));
  if (/^[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d+)?$/i.test(value)) return canonicalNumber(Number(value));
  return value.toLowerCase();
}

function canonicalNumber(n: number): string {
  return Number.isInteger(n) ? String(n) : String(Number(n.toPrecision(12)));
}

/** Exact-answer math: reward 1 when the normalized answer equals the normalized expected answer. */
export class MathVerifier extends VerifierServer {
  async verify(body: unknown): Promise<VerifyResult> {
    const { task, answer } = parseVerifierBody(MathVerifyBodySchema, body);
    const extracted = normalizeAnswer(answer);
    return { reward: extracted === normalizeAnswer(task.expected_answer) ? 1 : 0, extracted };
  }
}
