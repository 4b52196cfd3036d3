import { describe, expect, it } from "vitest";
import { ProgressReporter, type ProgressSnapshot } from "../../../coordinator/collect/progress-reporter.js";

/**
 * The "reading --tasks <path>" line holds the user's path, which need not be ASCII: control
 * characters in it must not reach the terminal (an escape sequence, a newline breaking the live
 * line), and wide characters must not make the cut line wrap (a character is not a column).
 */
function terminal(columns: number) {
  const written: string[] = [];
  const out = { write: (s: string) => written.push(s), isTTY: true, columns } as unknown as NodeJS.WritableStream;
  return { written, out };
}

/** Columns the test's characters take on a terminal: CJK ideographs and emoji two, the rest one. */
function displayWidth(text: string): number {
  let width = 0;
  for (const ch of text) {
    const cp = ch.codePointAt(0)!;
    width += (cp >= 0x4e00 && cp <= 0x9fff) || (cp >= 0x1f300 && cp <= 0x1faff) ? 2 : 1;
  }
  return width;
}

const snapshot: ProgressSnapshot = { total: 10, done: 0, doneBefore: 0, inFlight: 1, failed: 0, checkpoints: 0, lastCheckpointAt: undefined };

// eslint-disable-next-line no-control-regex
const CONTROL = /[\u0000-\u001f\u007f-\u009f\u200e\u200f\u202a-\u202e\u2066-\u2069\u2028\u2029]/u;

describe("progress line: the --tasks path", () => {
  it("control characters in the path are shown escaped, never written to the terminal", () => {
    for (const isTTY of [true, false]) {
      const written: string[] = [];
      const out = { write: (s: string) => written.push(s), isTTY, columns: 200 } as unknown as NodeJS.WritableStream;
      const reporter = new ProgressReporter(out, 0, () => 0);
      reporter.reading("a\u001b[2Jb\nc\rd\u202ee\u0085.jsonl", 1, 0);
      const line = written[0]!.replace(/^\r/, "").replace(/\n$/, "");
      expect(line).not.toMatch(CONTROL);
      expect(line).toBe("reading --tasks a\\x1b[2Jb\\nc\\rd\\u{202e}e\\x85.jsonl: 1 rows, 0 MiB so far");
    }
  });

  it("a path of wide characters is cut to the terminal's width in columns, not UTF-16 units", () => {
    const { written, out } = terminal(40);
    new ProgressReporter(out, 0, () => 0).reading(`/data/${"数据集".repeat(20)}.jsonl`, 1, 0);
    expect(displayWidth(written[0]!.slice(1))).toBeLessThanOrEqual(39);
  });

  it("a cut never splits a surrogate pair (an emoji) in two", () => {
    const { written, out } = terminal(40);
    new ProgressReporter(out, 0, () => 0).reading(`/data/${"😀".repeat(40)}`, 1, 0);
    const line = written[0]!.slice(1);
    expect(line).not.toMatch(/\p{Cs}/u); // a lone surrogate (half an emoji)
    expect(displayWidth(line)).toBeLessThanOrEqual(39);
  });

  it("the bar drawn over a reading line of wide characters covers all of it", () => {
    const { written, out } = terminal(400);
    const reporter = new ProgressReporter(out, 0, () => 0);
    reporter.reading(`/data/${"数据集".repeat(20)}.jsonl`, 1, 0);
    reporter.update(snapshot);
    reporter.finish();
    expect(displayWidth(written[1]!.slice(1))).toBeGreaterThanOrEqual(displayWidth(written[0]!.slice(1)));
  });
});
