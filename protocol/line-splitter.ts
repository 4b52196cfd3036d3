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
