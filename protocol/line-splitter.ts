import { isUtf8 } from "node:buffer";

/** One line of a byte stream: its bytes (with the newline when it has one) and where it starts. */
export interface SplitLine {
  bytes: Buffer;
  offset: number;
  terminated: boolean;
}

/**
 * Splits a stream of chunks into lines. The pieces of a line longer than a chunk are joined once,
 * when its newline (or the end) arrives: re-joining the carried part for every chunk made one
 * large line cost quadratic time.
 */
export class LineSplitter {
  private pending: Buffer[] = [];
  private lineOffset = 0;
  private position = 0;

  /** Bytes of the line not yet ended, so a caller can refuse one that grows past what it can use. */
  get pendingBytes(): number {
    return this.position - this.lineOffset;
  }

  /** The lines this chunk completes, in order. */
  push(chunk: Buffer): SplitLine[] {
    const lines: SplitLine[] = [];
    let start = 0;
    for (let newline = chunk.indexOf(0x0a); newline !== -1; newline = chunk.indexOf(0x0a, start)) {
      const piece = chunk.subarray(start, newline + 1);
      lines.push({ bytes: this.pending.length ? Buffer.concat([...this.pending, piece]) : piece, offset: this.lineOffset, terminated: true });
      this.pending = [];
      this.lineOffset = this.position + newline + 1;
      start = newline + 1;
    }
    // Copied: the caller may reuse its chunk buffer.
    if (start < chunk.byteLength) this.pending.push(Buffer.from(chunk.subarray(start)));
    this.position += chunk.byteLength;
    return lines;
  }

  /**
   * Drops the bytes of the line not yet ended (`pendingBytes` still counts them): a caller that will
   * refuse that line once it ends, or drop it as a torn tail, need not hold it meanwhile.
   */
  discardPending(): void {
    this.pending = [];
  }

  /** The final line without a newline, if any. */
  end(): SplitLine | undefined {
    if (!this.pending.length) return undefined;
    const line = { bytes: Buffer.concat(this.pending), offset: this.lineOffset, terminated: false };
    this.pending = [];
    return line;
  }
}

/** One line as text, and where its bytes are in the stream (a reader may read them again there). */
export interface TextLine {
  text: string;
  /** Numbered from 1. */
  number: number;
  /** Where the line starts in the stream, in bytes. */
  offset: number;
  /** The bytes `text` was decoded from: the line without its newline (and a carriage return before it). */
  byteLength: number;
  /** False when those bytes are not valid UTF-8: `text` then holds U+FFFD in place of each bad sequence. */
  utf8: boolean;
}

/** A UTF-8 byte order mark: some editors (Windows Notepad, PowerShell's `Out-File -Encoding utf8`) begin a file with it. */
const UTF8_BOM = Buffer.from([0xef, 0xbb, 0xbf]);

/**
 * The lines of a stream as text, numbered from 1: the newline (and a carriage return before it)
 * removed, a final line without one included, and a UTF-8 byte order mark at the stream's start left
 * out of the first line (JSON.parse refuses one: the file's first line read as "not JSON"). A line of more than `maxLineBytes` (newline included)
 * is refused with `tooLong(its number)` as soon as that many bytes came without a newline: never
 * held whole, nor made into a string longer than V8 allows (its RangeError, or the heap's end).
 */
export async function* textLines(
  input: AsyncIterable<Buffer | string>,
  maxLineBytes: number,
  tooLong: (number: number) => Error,
): AsyncGenerator<TextLine> {
  const splitter = new LineSplitter();
  let number = 0;
  const text = (line: SplitLine, number: number): TextLine => {
    let end = line.terminated ? line.bytes.length - 1 : line.bytes.length;
    if (end > 0 && line.bytes[end - 1] === 0x0d) end--;
    const start = line.offset === 0 && end >= UTF8_BOM.length && line.bytes.subarray(0, UTF8_BOM.length).equals(UTF8_BOM) ? UTF8_BOM.length : 0;
    const decoded = line.bytes.toString("utf8", start, end);
    // Checked only when the decoder put in a replacement character (or the text holds one).
    const utf8 = !decoded.includes("\uFFFD") || isUtf8(line.bytes.subarray(start, end));
    return { text: decoded, number, offset: line.offset + start, byteLength: end - start, utf8 };
  };
  for await (const chunk of input) {
    for (const line of splitter.push(typeof chunk === "string" ? Buffer.from(chunk) : chunk)) {
      number++;
      if (line.bytes.length > maxLineBytes) throw tooLong(number);
      yield text(line, number);
    }
    if (splitter.pendingBytes > maxLineBytes) throw tooLong(number + 1);
  }
  const last = splitter.end();
  if (last) {
    number++;
    if (last.bytes.length > maxLineBytes) throw tooLong(number);
    yield text(last, number);
  }
}
