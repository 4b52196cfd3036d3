import { cutToColumns, printable, widthAtMost } from "./terminal-text.js";

/**
 * What a person watching a collection sees: on a TTY a live one-line bar (done / in flight /
 * failed, rate, ETA, age of the last checkpoint); otherwise a plain line every interval.
 */
export interface ProgressSnapshot {
  total: number;
  done: number;
  /** Rows an earlier run had finished (in `done`, but not in the rate: this run did not do them). */
  doneBefore: number;
  inFlight: number;
  failed: number;
  checkpoints: number;
  /** The reporter's clock (`ProgressReporter.now`, progressClock by default) at the last published checkpoint. */
  lastCheckpointAt: number | undefined;
  /** Rows waiting for a retire whose last try failed (Gym servers unreachable): shown when not 0. */
  retiresFailing?: number;
}

/** The progress line's clock: monotonic ms, so a wall-clock step moves no rate, ETA or age. */
export const progressClock = (): number => performance.now();

/** How often the live bar is redrawn while nothing changes (its rate, ETA and ages move on). */
const LIVE_REFRESH_MS = 1000;

export class ProgressReporter {
  private startedAt: number;
  private lastPlainAt = 0;
  /** Columns the live line last drawn takes at most: the next one is padded to cover them. */
  private lastWidth = 0;
  private source: (() => ProgressSnapshot) | undefined;
  private timer: NodeJS.Timeout | undefined;
  /** finish() ran: the process is on its way out, and a line drawn now would stay unended. */
  private finished = false;

  constructor(
    private readonly out: NodeJS.WritableStream & { isTTY?: boolean; columns?: number },
    private readonly plainIntervalMs = 10_000,
    /** Its clock (ms): the times a snapshot carries (lastCheckpointAt) are taken on it too. */
    readonly now: () => number = progressClock,
  ) {
    this.startedAt = now();
  }

  get interactive(): boolean {
    return this.out.isTTY === true;
  }

  /**
   * The run starts now (the rate counts from here), and a line is written on a timer too: rows
   * may run for minutes with nothing finishing, and the line must not stop meanwhile.
   */
  start(source: () => ProgressSnapshot): void {
    if (this.finished) return;
    this.startedAt = this.now();
    this.source = source;
    this.arm();
  }

  update(snapshot: ProgressSnapshot, force = false): void {
    if (this.finished) return;
    this.draw(this.format(snapshot), force);
  }

  /**
   * How far start-up's read of the tasks file got: millions of rows take a minute or more to read
   * and check, which is no hang. Drawn as the progress line is (live, or a plain line at most every
   * interval); the bar that follows draws over it. The path is the user's: shown with its control
   * characters escaped, so it can neither move the cursor nor break the line.
   */
  reading(path: string, rows: number, bytes: number): void {
    if (this.finished) return;
    this.draw(`reading --tasks ${printable(path)}: ${rows} rows, ${Math.floor(bytes / 2 ** 20)} MiB so far`, false);
  }

  /** The read ended: a live reading line, if one was drawn, is ended, so what follows starts on a line of its own. */
  readDone(): void {
    if (!this.interactive || !this.lastWidth) return;
    this.out.write("\n");
    this.lastWidth = 0;
  }

  private draw(line: string, force: boolean): void {
    if (this.interactive) {
      const fitted = this.fitted(line);
      const padded = this.fitted(fitted + " ".repeat(Math.max(0, this.lastWidth - widthAtMost(fitted))));
      this.lastWidth = widthAtMost(fitted);
      this.out.write(`\r${padded}`);
      this.arm();
    } else if (force || this.now() - this.lastPlainAt >= this.plainIntervalMs) {
      this.lastPlainAt = this.now();
      this.out.write(`${line}\n`);
      this.arm();
    }
  }

  /**
   * Stops the timer and ends the live line so later output starts on a fresh one. Called on every
   * way out (the summary, a failure, a signal), so once only counts: nothing is drawn after it.
   */
  finish(): void {
    this.finished = true;
    clearTimeout(this.timer);
    this.source = undefined;
    if (this.interactive && this.lastWidth) this.out.write("\n");
    this.lastWidth = 0;
  }

  /**
   * The live line cut to the terminal's width (read at each redraw: it may be resized), less one
   * column: a line reaching the last one wraps on some terminals, and `\r` returns only to the start
   * of its last row, so each redraw would leave a row behind. The bar is ASCII, a character a column,
   * but the reading line holds the user's path: its other characters count as two columns (a wide
   * one takes two), so the cut line never wraps, and a cut never splits a character.
   */
  private fitted(line: string): string {
    const columns = this.out.columns;
    return columns !== undefined && columns > 1 ? cutToColumns(line, columns - 1) : line;
  }

  format(s: ProgressSnapshot): string {
    const elapsed = (this.now() - this.startedAt) / 1000;
    const rate = elapsed > 0 ? Math.max(0, s.done - s.doneBefore) / elapsed : 0;
    const remaining = s.total - s.done - s.failed;
    const eta = rate > 0 ? formatSeconds(remaining / rate) : "?";
    const width = 24;
    const filled = s.total ? Math.round((s.done / s.total) * width) : 0;
    const bar = `${"#".repeat(filled)}${"-".repeat(width - filled)}`;
    const age = s.lastCheckpointAt === undefined ? "none" : `${formatSeconds((this.now() - s.lastCheckpointAt) / 1000)} ago`;
    const retires = s.retiresFailing ? ` | retire failing for ${s.retiresFailing} rows` : "";
    return `[${bar}] ${s.done}/${s.total} done, ${s.inFlight} in flight, ${s.failed} failed | ${rate.toFixed(1)} rows/s, ETA ${eta} | checkpoints ${s.checkpoints}, last ${age}${retires}`;
  }

  /** The next timed line: one interval after the last one written, whatever wrote it. */
  private arm(): void {
    clearTimeout(this.timer);
    const source = this.source;
    if (!source) return;
    this.timer = setTimeout(() => this.update(source(), true), this.interactive ? LIVE_REFRESH_MS : this.plainIntervalMs);
    this.timer.unref();
  }
}

export function formatSeconds(seconds: number): string {
  if (!Number.isFinite(seconds)) return "?";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}
