/**
 * What a person watching a collection sees: on a TTY a live one-line bar (done / in flight /
 * failed, rate, ETA, age of the last checkpoint); otherwise a plain line every interval.
 */
export interface ProgressSnapshot {
  total: number;
  done: number;
  inFlight: number;
  failed: number;
  checkpoints: number;
  lastCheckpointAt: number | undefined;
}

export class ProgressReporter {
  private readonly startedAt: number;
  private lastPlainAt = 0;
  private lastLength = 0;

  constructor(
    private readonly out: NodeJS.WritableStream & { isTTY?: boolean },
    private readonly plainIntervalMs = 10_000,
    private readonly now: () => number = Date.now,
  ) {
    this.startedAt = now();
  }

  get interactive(): boolean {
    return this.out.isTTY === true;
  }

  update(snapshot: ProgressSnapshot, force = false): void {
    const line = this.format(snapshot);
    if (this.interactive) {
      const padded = line.padEnd(this.lastLength);
      this.lastLength = line.length;
      this.out.write(`\r${padded}`);
    } else if (force || this.now() - this.lastPlainAt >= this.plainIntervalMs) {
      this.lastPlainAt = this.now();
      this.out.write(`${line}\n`);
    }
  }

  /** Ends the live line so later output starts on a fresh one. */
  finish(): void {
    if (this.interactive && this.lastLength) this.out.write("\n");
    this.lastLength = 0;
  }

  format(s: ProgressSnapshot): string {
    const elapsed = (this.now() - this.startedAt) / 1000;
    const rate = elapsed > 0 ? s.done / elapsed : 0;
    const remaining = s.total - s.done - s.failed;
    const eta = rate > 0 ? formatSeconds(remaining / rate) : "?";
    const width = 24;
    const filled = s.total ? Math.round((s.done / s.total) * width) : 0;
    const bar = `${"#".repeat(filled)}${"-".repeat(width - filled)}`;
    const age = s.lastCheckpointAt === undefined ? "none" : `${formatSeconds((this.now() - s.lastCheckpointAt) / 1000)} ago`;
    return `[${bar}] ${s.done}/${s.total} done, ${s.inFlight} in flight, ${s.failed} failed | ${rate.toFixed(1)} rows/s, ETA ${eta} | checkpoints ${s.checkpoints}, last ${age}`;
  }
}

export function formatSeconds(seconds: number): string {
  if (!Number.isFinite(seconds)) return "?";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${String(s % 60).padStart(2, "0")}s`;
  return `${Math.floor(s / 3600)}h${String(Math.floor((s % 3600) / 60)).padStart(2, "0")}m`;
}
