/**
 * The first integer literal of a JSON text that JSON.parse cannot keep, or undefined: one whose
 * double, written back (as JSON.stringify writes checkpoint.json), is other text. JSON.parse
 * rounds without a word, so a Python controller's 64-bit seed `9223372036854775807` would come
 * back as `9223372036854776000`; `1152921504606847000`, JSON.stringify's text of 2^60, is kept.
 * Literals with a fraction or an exponent are doubles on both sides and pass. `text` must be valid
 * JSON (scan it only after JSON.parse accepted it); digits inside strings are skipped.
 */
export function unsafeJsonInteger(text: string): string | undefined {
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (c === 0x22) {
      // Skip the string: an escape takes the next character with it.
      for (i++; text.charCodeAt(i) !== 0x22; i += text.charCodeAt(i) === 0x5c ? 2 : 1);
    } else if (c === 0x2d || (c >= 0x30 && c <= 0x39)) {
      let end = i + 1;
      while (end < text.length && isNumberChar(text.charCodeAt(end))) end++;
      const literal = text.slice(i, end);
      // 15 digits or fewer are always exact; only plain integers are checked.
      if (literal.length > 15 && /^-?\d+$/.test(literal) && String(Number(literal)) !== literal) return literal;
      i = end - 1;
    }
  }
  return undefined;
}

function isNumberChar(c: number): boolean {
  return (c >= 0x30 && c <= 0x39) || c === 0x2e || c === 0x65 || c === 0x45 || c === 0x2b || c === 0x2d;
}
