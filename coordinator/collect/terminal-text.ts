/**
 * Text from outside (a --tasks path) on a terminal line: control and format characters (an escape
 * sequence, a newline, a bidirectional override, a lone surrogate) would move the cursor, break the
 * line or reorder it, so they are shown escaped (`\x1b`, `\n`, `\u{202e}`).
 */
const UNPRINTABLE = /[\p{Cc}\p{Cf}\p{Cs}\p{Zl}\p{Zp}]/gu;

const NAMED: Record<string, string> = { "\n": "\\n", "\r": "\\r", "\t": "\\t" };

export function printable(text: string): string {
  return text.replace(UNPRINTABLE, (ch) => {
    const cp = ch.codePointAt(0)!;
    return NAMED[ch] ?? (cp < 0x100 ? `\\x${cp.toString(16).padStart(2, "0")}` : `\\u{${cp.toString(16)}}`);
  });
}

/**
 * Columns `ch` (one code point) takes at most: printable ASCII one, anything else two (a wide
 * CJK or emoji character takes two; counting a narrow or combining one as two only leaves the line
 * shorter, never wrapped). No table of widths to keep up to date with Unicode.
 */
function columnsAtMost(ch: string): number {
  return ch.length === 1 && ch >= " " && ch <= "~" ? 1 : 2;
}

/** Columns `text` (printable) takes at most. */
export function widthAtMost(text: string): number {
  let width = 0;
  for (const ch of text) width += columnsAtMost(ch);
  return width;
}

/** The longest start of `text` that takes at most `columns`, cut between code points (never inside a surrogate pair). */
export function cutToColumns(text: string, columns: number): string {
  let width = 0;
  let end = 0;
  for (const ch of text) {
    width += columnsAtMost(ch);
    if (width > columns) break;
    end += ch.length;
  }
  return text.slice(0, end);
}
